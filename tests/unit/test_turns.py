"""A token's turns (service/turns.py): one read at a time per token, each followed by a rest in
proportion to its length; other tokens never wait on it; a flood past the queue or the wait is
refused."""

from __future__ import annotations

import threading
import time

import pytest

from service.turns import SWEEP_AT, Turns

__all__: list[str] = []

A, B = b"a" * 32, b"b" * 32


def test_the_next_read_of_a_token_starts_only_after_the_last_ones_rest() -> None:
    turns = Turns(share=0.5, queue=10, wait=10.0)
    first = turns.take(A)
    assert first is not None
    time.sleep(0.05)  # NOTE: the read itself: its length sets the rest
    given = time.monotonic()
    turns.give(A, first)
    second = turns.take(A)
    assert second is not None
    # NOTE: share 0.5: the rest is as long as the read was, so the token had at most half the time.
    assert second - given >= given - first - 0.001


def test_another_token_takes_its_turn_while_the_first_is_busy_and_resting() -> None:
    turns = Turns(share=0.01, queue=10, wait=10.0)
    first = turns.take(A)
    assert first is not None
    other = turns.take(B)
    assert other is not None and other - first < 1.0
    turns.give(B, other)
    turns.give(A, first)
    assert turns.take(B) is not None


def test_a_waiting_read_gets_the_turn_when_it_is_given() -> None:
    turns = Turns(share=1.0, queue=10, wait=10.0)
    first = turns.take(A)
    assert first is not None
    got: list[float | None] = []
    waiter = threading.Thread(target=lambda: got.append(turns.take(A)))
    waiter.start()
    waiter.join(0.1)
    assert waiter.is_alive(), "the second read waits while the first holds the turn"
    turns.give(A, first)
    waiter.join(5)
    assert got and got[0] is not None


def test_past_the_queue_a_read_is_refused_at_once_and_past_the_wait_after_it() -> None:
    refuse_at_once = Turns(share=1.0, queue=0, wait=10.0)
    assert refuse_at_once.take(A) is not None
    started = time.monotonic()
    assert refuse_at_once.take(A) is None
    assert time.monotonic() - started < 1.0

    patient = Turns(share=1.0, queue=5, wait=0.2)
    assert patient.take(A) is not None
    started = time.monotonic()
    assert patient.take(A) is None
    assert time.monotonic() - started >= 0.2


def test_idle_lanes_are_dropped_so_many_tokens_never_grow_the_process() -> None:
    turns = Turns(share=1.0, queue=1, wait=1.0)
    for n in range(SWEEP_AT * 2):
        token = n.to_bytes(32, "big")
        started = turns.take(token)
        assert started is not None
        turns.give(token, started)
    assert len(turns._lanes) <= SWEEP_AT


@pytest.mark.parametrize("share,queue,wait", [(0.0, 1, 1.0), (1.5, 1, 1.0), (0.5, -1, 1.0)])
def test_settings_outside_their_range_are_refused(share: float, queue: int, wait: float) -> None:
    with pytest.raises(ValueError):
        Turns(share, queue, wait)
