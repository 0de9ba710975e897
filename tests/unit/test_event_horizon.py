"""The hub's pure parts: which event ids it may hand out (EventHorizon), and its stream caps'
defaults, decided without a database."""

from __future__ import annotations

import pytest

from jobqueue.core.horizon import EventHorizon, Observed
from jobqueue.core.settings import Settings, SettingsError

NOBODY: frozenset[str] = frozenset()


def ready_at(cursor: int) -> EventHorizon:
    horizon = EventHorizon()
    assert horizon.observe(cursor, NOBODY, prepared=False) is Observed.READY
    assert horizon.cursor == cursor
    return horizon


def test_a_start_with_no_event_writer_in_flight_is_ready_at_once() -> None:
    horizon = EventHorizon()
    assert horizon.cursor is None and horizon.deliverable([1]) == 0
    assert horizon.observe(7, NOBODY, prepared=False) is Observed.READY
    assert horizon.cursor == 7


def test_a_start_waits_only_for_the_writers_then_in_flight() -> None:
    horizon = EventHorizon()
    assert horizon.observe(7, frozenset({"3/10"}), prepared=False) is Observed.NOTHING
    assert horizon.cursor is None
    # A writer that began after the first look (new ids, above 7) does not hold the start.
    assert horizon.observe(9, frozenset({"4/20"}), prepared=False) is Observed.READY
    assert horizon.cursor == 7


def test_contiguous_ids_go_without_any_barrier() -> None:
    horizon = ready_at(4)
    assert horizon.deliverable([5, 6, 7]) == 3
    horizon.advance(7)
    assert horizon.deliverable([8]) == 1


def test_an_id_after_a_gap_waits_until_the_writers_of_the_gap_have_ended() -> None:
    horizon = ready_at(4)
    # Id 5 is taken by "3/10", still open; 6 committed.
    horizon.observe(6, frozenset({"3/10"}), prepared=False)
    assert horizon.deliverable([6]) == 0
    # Later writers ("5/30") do not matter; only those of the barrier do.
    horizon.observe(8, frozenset({"3/10", "5/30"}), prepared=False)
    assert horizon.deliverable([6]) == 0
    horizon.observe(8, frozenset({"5/30"}), prepared=False)
    assert horizon.horizon == 6
    # 5 aborted (it never appears): 6 goes; 8 waits behind 7, which "5/30" may hold.
    assert horizon.deliverable([6, 8]) == 1


def test_a_gap_with_no_writer_in_flight_is_an_aborted_id_stepped_over_at_once() -> None:
    horizon = ready_at(4)
    horizon.observe(6, NOBODY, prepared=False)
    assert horizon.deliverable([6]) == 1


def test_a_prepared_transaction_holds_every_barrier_while_it_holds_the_lock() -> None:
    horizon = ready_at(4)
    horizon.observe(6, frozenset({"3/10"}), prepared=False)
    # "3/10" PREPAREd: its lock now shows under another name; the barrier must not pass.
    horizon.observe(6, frozenset({"-1/900"}), prepared=True)
    assert horizon.deliverable([6]) == 0
    horizon.observe(6, NOBODY, prepared=False)
    assert horizon.deliverable([6]) == 1


def test_a_sequence_that_went_back_restarts_the_cursor_at_zero() -> None:
    horizon = ready_at(40)
    assert horizon.observe(2, NOBODY, prepared=False) is Observed.RESTARTED
    assert horizon.cursor == 0
    assert horizon.deliverable([1, 2]) == 2


def test_a_process_takes_streams_for_half_its_connections_unless_told_otherwise() -> None:
    base = {"DATABASE_URL": "postgresql:///x"}
    assert Settings.from_env(base).sse_max_streams == 500
    assert Settings.from_env({**base, "SA_WEB_CONNECTIONS": "40"}).sse_max_streams == 20
    assert Settings.from_env({**base, "SA_WEB_CONNECTIONS": "40",
                              "SA_SSE_MAX_STREAMS": "7"}).sse_max_streams == 7
    with pytest.raises(SettingsError, match="SA_SSE_MAX_STREAMS_PER_TOKEN"):
        Settings.from_env({**base, "SA_SSE_MAX_STREAMS_PER_TOKEN": "0"})
