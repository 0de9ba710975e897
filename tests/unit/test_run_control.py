"""RunControl: an abandon cuts the call in flight, never a finished one or the next one."""

from __future__ import annotations

from jobqueue.runtime.run_control import RunControl


def test_an_abandon_cuts_the_attached_call_once() -> None:
    cuts: list[str] = []
    control = RunControl()
    control.attach(lambda: cuts.append("cut"))

    assert control.abandon() is True
    assert control.abandon() is True
    assert cuts == ["cut"]
    assert control.begin_finish() is False


def test_a_call_attached_after_the_abandon_is_cut_at_once() -> None:
    cuts: list[str] = []
    control = RunControl()
    assert control.abandon() is True

    control.attach(lambda: cuts.append("cut"))

    assert cuts == ["cut"]


def test_a_finishing_or_detached_call_is_never_cut() -> None:
    cuts: list[str] = []
    finishing = RunControl()
    finishing.attach(lambda: cuts.append("finishing"))
    assert finishing.begin_finish() is True
    detached = RunControl()
    detached.attach(lambda: cuts.append("detached"))
    detached.detach()

    assert finishing.abandon() is False
    assert detached.abandon() is True
    assert cuts == []
