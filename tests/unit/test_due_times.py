"""DueTimes: when a worker's claim loop wakes for the scheduled jobs it heard of."""

from __future__ import annotations

from jobqueue.runtime.due_times import DueTimes


def test_the_loop_sleeps_until_the_soonest_due_time_heard_in_any_order() -> None:
    dues = DueTimes()
    for due in (130.0, 104.0, 117.0):
        dues.expect(due)
    assert dues.sleep_for(now=100.0, longest=2.0) == 2.0
    assert dues.sleep_for(now=103.0, longest=2.0) == 1.0


def test_a_passed_due_time_wakes_at_once_and_is_then_forgotten() -> None:
    dues = DueTimes()
    dues.expect(10.0)
    dues.expect(12.0)
    assert dues.sleep_for(now=10.5, longest=5.0) == 0.0
    assert dues.sleep_for(now=10.5, longest=5.0) == 1.5
    assert dues.sleep_for(now=12.0, longest=5.0) == 0.0
    assert dues.sleep_for(now=12.0, longest=5.0) == 5.0


def test_past_its_bound_the_latest_due_times_are_dropped() -> None:
    dues = DueTimes(keep=2)
    for due in (30.0, 10.0, 20.0):
        dues.expect(due)
    assert dues.sleep_for(now=25.0, longest=100.0) == 0.0
    assert dues.sleep_for(now=25.0, longest=100.0) == 100.0
