"""Token budgets, pure: a call's token estimate, the learned tokens-per-character ratio, and what
a provider's `x-ratelimit-*` headers say about when to stop calling; no I/O.

The route gate (jobqueue/runtime/gate.py) reserves `estimate(...)` tokens against the route's
window before a call and settles the reservation to the reported usage after it; the headers an
answer carries may pause the route before the provider answers 429 (`header_pause`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

__all__ = ["DEFAULT_MAX_TOKENS", "DEFAULT_RATIO", "RateLimitHeaders", "estimate",
           "header_pause", "learn_ratio", "parse_reset", "prompt_chars", "tighter"]

DEFAULT_RATIO = 0.25
"""Tokens per character before a route has reported any usage (English text: ~4 characters a
token); deliberately on the high side, so the first reservations over-reserve, never under."""

DEFAULT_MAX_TOKENS = 256
"""The answer's tokens reserved for a call without `max_tokens` on a route without
`max_tokens_default`."""

# NOTE: each message costs a few tokens of framing on OpenAI's side (role, separators).
_PER_MESSAGE = 4
# NOTE: one call moves the ratio a fifth of the way: a few calls learn it, one odd prompt
# (code, another language) does not swing it.
_LEARNING_RATE = 0.2
_RATIO_BOUNDS = (0.01, 4.0)


def prompt_chars(messages: Iterable[Mapping[str, str]]) -> tuple[int, int]:
    """(characters of every message's content, number of messages)."""
    chars = count = 0
    for message in messages:
        chars += len(message.get("content", ""))
        count += 1
    return chars, count


def estimate(chars: int, messages: int, ratio: float, max_tokens: int) -> int:
    """The tokens a call may cost: its prompt (characters x ratio, plus framing) and its answer
    (`max_tokens`, what the provider itself counts against a tokens-per-minute limit)."""
    return math.ceil(chars * ratio) + messages * _PER_MESSAGE + max(0, max_tokens)


def learn_ratio(ratio: float, chars: int, tokens_in: int | None) -> float:
    """The route's ratio moved toward what one call reported (unchanged without a count)."""
    if tokens_in is None or chars <= 0:
        return ratio
    # NOTE: the framing stays in what is learned (and is added again by `estimate`): an estimate
    # a little high costs a little throughput, one a little low costs 429s.
    seen = tokens_in / chars
    low, high = _RATIO_BOUNDS
    return min(high, max(low, ratio + _LEARNING_RATE * (seen - ratio)))


_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_reset(text: str | None) -> float | None:
    """Seconds from an `x-ratelimit-reset-*` value: OpenAI's Go-style durations (`1s`, `6m0s`,
    `20ms`, `1h2m3.5s`) or a bare number of seconds; None when absent or unreadable."""
    if text is None:
        return None
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        return value if math.isfinite(value) and value >= 0 else None
    parts = _DURATION_RE.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNITS[u] for n, u in parts)


def _count(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        value = int(text.strip())
    except ValueError:
        return None
    return value if value >= 0 else None


@dataclass(frozen=True)
class RateLimitHeaders:
    """What an answer's `x-ratelimit-*` headers say (None: not sent, or unreadable).

    OpenAI sends all six (`limit-`, `remaining-`, `reset-` for requests and tokens); Azure
    OpenAI sends `remaining-requests` and `remaining-tokens`.
    """

    remaining_requests: int | None = None
    remaining_tokens: int | None = None
    reset_requests: float | None = None
    reset_tokens: float | None = None
    limit_requests: int | None = None
    limit_tokens: int | None = None

    @classmethod
    def read(cls, header: Callable[[str], str | None]) -> RateLimitHeaders | None:
        """Reads them through `header` (a case-insensitive getter); None when none was sent."""
        found = cls(_count(header("x-ratelimit-remaining-requests")),
                    _count(header("x-ratelimit-remaining-tokens")),
                    parse_reset(header("x-ratelimit-reset-requests")),
                    parse_reset(header("x-ratelimit-reset-tokens")),
                    _count(header("x-ratelimit-limit-requests")),
                    _count(header("x-ratelimit-limit-tokens")))
        return None if found == cls() else found


def header_pause(headers: RateLimitHeaders, need: int, fallback: float) -> tuple[float, str] | None:
    """How long to pause the route, and why, before the provider would answer 429.

    Args:
        headers: the last answer's.
        need: the tokens the next call would reserve.
        fallback: seconds to pause when the provider says "none left" without a reset time.

    Returns:
        (seconds, "remaining_requests" | "remaining_tokens"), or None to keep calling.
    """
    if headers.remaining_requests is not None and headers.remaining_requests < 1:
        return _reset(headers.reset_requests, fallback), "remaining_requests"
    if headers.remaining_tokens is not None and headers.remaining_tokens < need:
        return _reset(headers.reset_tokens, fallback), "remaining_tokens"
    return None


def _reset(seconds: float | None, fallback: float) -> float:
    return fallback if seconds is None else seconds


def tighter(configured: int, told: int | None) -> int:
    """The lower of a configured limit and the provider's (0 and None: none)."""
    if not told:
        return configured
    return min(configured, told) if configured else told
