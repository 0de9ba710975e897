"""Unit tests for the job state machine table."""

from __future__ import annotations

import itertools

import pytest

from jobqueue.core.states import TERMINAL, TRANSITIONS, JobState, is_legal, is_terminal

__all__: list[str] = []

Q = JobState.QUEUED
R = JobState.RUNNING
S = JobState.SUCCEEDED
F = JobState.FAILED
C = JobState.CANCELLED
X = JobState.SUPERSEDED

# NOTE: Written out by hand from spec §3 rather than derived from TRANSITIONS,
# so a change to the table has to be made twice on purpose.
LEGAL: list[tuple[JobState | None, JobState]] = [
    (None, Q),
    (Q, R),
    (Q, C),
    (R, S),
    (R, Q),
    (R, F),
    (R, C),
    (S, X),
    (F, X),
    (C, X),
]


def test_state_values_match_database_text() -> None:
    assert [s.value for s in JobState] == [
        "queued",
        "running",
        "succeeded",
        "failed",
        "cancelled",
        "superseded",
    ]


def test_transition_table_is_exactly_the_spec() -> None:
    assert set(LEGAL) == TRANSITIONS
    assert len(TRANSITIONS) == 10


@pytest.mark.parametrize(("from_state", "to_state"), LEGAL)
def test_legal_transitions(from_state: JobState | None, to_state: JobState) -> None:
    assert is_legal(from_state, to_state) is True


@pytest.mark.parametrize(
    ("from_state", "to_state"),
    [
        # terminal states go nowhere except superseded
        (S, Q),
        (S, R),
        (S, F),
        (S, C),
        (F, Q),
        (F, R),
        (F, S),
        (F, C),
        (C, Q),
        (C, R),
        (C, S),
        (C, F),
        # superseded is final
        (X, Q),
        (X, R),
        (X, S),
        (X, F),
        (X, C),
        (X, X),
        # skipping running, or superseding live work
        (Q, S),
        (Q, F),
        (Q, X),
        (R, X),
        # self-loops
        (Q, Q),
        (R, R),
        # creation only yields queued
        (None, R),
        (None, S),
        (None, X),
    ],
)
def test_illegal_transitions(from_state: JobState | None, to_state: JobState) -> None:
    assert is_legal(from_state, to_state) is False


def test_every_pair_outside_the_table_is_illegal() -> None:
    sources: list[JobState | None] = [None, *JobState]
    illegal = [(a, b) for a, b in itertools.product(sources, JobState) if (a, b) not in set(LEGAL)]
    assert len(illegal) == 7 * 6 - 10
    assert not any(is_legal(a, b) for a, b in illegal)


@pytest.mark.parametrize(
    ("state", "terminal"),
    [(Q, False), (R, False), (S, True), (F, True), (C, True), (X, True)],
)
def test_terminal_membership(state: JobState, terminal: bool) -> None:
    assert is_terminal(state) is terminal
    assert (state in TERMINAL) is terminal


def test_terminal_set_exact() -> None:
    assert frozenset({S, F, C, X}) == TERMINAL


def test_terminal_states_only_lead_to_superseded() -> None:
    for from_state, to_state in TRANSITIONS:
        if from_state is not None and is_terminal(from_state):
            assert to_state is X
