"""The fake provider's own rate limits: requests and tokens per window, enforced as a provider
does (429 past them) and told in OpenAI's `x-ratelimit-*` headers on every answer.

Windows are `window` seconds long, aligned on the Unix epoch (so a run's windows line up with
the workers' SA_ROUTE_LIMIT_WINDOW ones, which are aligned on 2000-01-01 UTC: the same instants
for any window dividing a day). A call counts its prompt's tokens (whitespace-split words, as
the usage the fake reports) plus its `max_tokens` (else its reply's), at arrival, as OpenAI
counts a call against a tokens-per-minute limit.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Admission", "ProviderLimits", "format_reset"]


def format_reset(seconds: float) -> str:
    """A reset time as OpenAI writes it: `20ms`, `1.5s`, `6m0s`."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    if seconds < 60:
        return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{int(rest)}s"


@dataclass(frozen=True)
class Admission:
    """Whether a call is served, the headers its answer carries, and its Retry-After if not."""

    allowed: bool
    headers: dict[str, str]
    retry_after: str | None = None


class ProviderLimits:
    """Counts calls and tokens per window; safe to share between handler threads."""

    def __init__(self, rpm: int, tpm: int, window: float,
                 clock: Callable[[], float] = time.time) -> None:
        """Args:
            rpm: requests per window (0: no limit).
            tpm: tokens per window (0: no limit).
            window: the window's length in seconds (60 as OpenAI's minute; shorter in benches).
            clock: wall-clock seconds (epoch-aligned windows).
        """
        self.rpm, self.tpm, self.window = rpm, tpm, window
        self._clock = clock
        self._lock = threading.Lock()
        self._start = -math.inf
        self._requests = 0
        self._tokens = 0
        self.limited = 0
        self.served_tokens = 0

    @property
    def active(self) -> bool:
        return bool(self.rpm or self.tpm)

    def admit(self, tokens: int) -> Admission:
        """Counts one call of `tokens` if it fits both limits; the answer's headers either way."""
        now = self._clock()
        with self._lock:
            start = math.floor(now / self.window) * self.window
            if start != self._start:
                self._start, self._requests, self._tokens = start, 0, 0
            allowed = ((not self.rpm or self._requests < self.rpm)
                       and (not self.tpm or self._tokens + tokens <= self.tpm))
            if allowed:
                self._requests += 1
                self._tokens += tokens
                self.served_tokens += tokens
            else:
                self.limited += 1
            reset = format_reset(start + self.window - now)
            headers: dict[str, str] = {}
            if self.rpm:
                headers.update({"x-ratelimit-limit-requests": str(self.rpm),
                                "x-ratelimit-remaining-requests": str(self.rpm - self._requests),
                                "x-ratelimit-reset-requests": reset})
            if self.tpm:
                headers.update({"x-ratelimit-limit-tokens": str(self.tpm),
                                "x-ratelimit-remaining-tokens": str(max(0, self.tpm - self._tokens)),
                                "x-ratelimit-reset-tokens": reset})
        retry = None if allowed else str(max(1, math.ceil(start + self.window - now)))
        return Admission(allowed, headers, retry)
