"""The CLI's durations (`90s`, `30m`, `12h`, `7d`, `2w`): one parser for --expires, --since and
--before, which answers a duration too large for a date as bad input, not a traceback."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

__all__ = ["DURATION_FORMS", "shift"]

DURATION_FORMS = "90s, 30m, 12h, 7d, 2w"

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def shift(text: str, now: datetime, sign: int) -> datetime | None:
    """`now` moved by the duration `text` (`sign` 1: later, -1: earlier); None when `text` is no
    duration.

    Raises:
        ValueError: the duration is zero, or the instant it names is past what a date can hold
            (year 1 to 9999).
    """
    match = _DURATION.match(text)
    if match is None:
        return None
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds <= 0:
        raise ValueError("a duration must be positive")
    try:
        return now + sign * timedelta(seconds=seconds)
    except OverflowError:
        raise ValueError(f"{text.strip()!r} is too long: the date it names is past the year "
                         f"{'9999' if sign > 0 else '1'}") from None
