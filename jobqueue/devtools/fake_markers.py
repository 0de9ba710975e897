"""What each request to the fake provider gets: the server's random knobs and its markers.

Markers anywhere in the LAST user message pick a behaviour per request (unknown ones are ignored;
latency combines with the rest, otherwise the first failure marker in text order wins):

* ``[fake:latency=S]`` sleep S seconds first; ``[fake:hang]`` never answer.
* ``[fake:429]`` / ``[fake:429=N]`` 429 with ``Retry-After: 1`` / ``N``; ``[fake:429-nohdr]`` none.
* ``[fake:400|401|403|404|422]`` and ``[fake:5xx]`` (a concrete code) answer that status.
* ``[fake:malformed]`` 200 with truncated JSON; ``[fake:empty]`` 200 JSON without ``choices``.
* ``[fake:flaky=K]`` the first K requests with this exact message text answer 503, later ones 200.
* ``[fake:drip=S]`` the normal answer, status line and headers included, one byte every S seconds.
* ``[fake:bytes=N]`` a normal answer whose reply is N characters long.
* ``[fake:nul]`` / ``[fake:surrogate]`` a reply holding a NUL / a lone surrogate (``\\ud800``):
  valid JSON that Postgres cannot store.
* ``[fake:stream-gap=S]`` paces a streamed answer's chunks; ``[fake:stream-cut=N]`` drops the
  first such answer after N chunks.

Server-wide knobs live in :class:`FakeConfig`. Parsing is apart from the HTTP server
(jobqueue/devtools/fake_server.py) so a marker's meaning is read in one place.
"""

from __future__ import annotations

import math
import random
import re
import threading
from dataclasses import dataclass
from typing import Literal, cast

__all__ = ["FLAVOURS", "FakeConfig", "Markers", "Outcome", "nonneg_float"]

FLAVOURS = ("openai", "azure", "vllm", "ollama")
"""Whose error bodies the server answers with."""

_MARKER_RE = re.compile(r"\[fake:([^\]\s]+)\]")
_CLIENT_ERRORS = frozenset({400, 401, 403, 404, 422})


@dataclass(frozen=True)
class FakeConfig:
    """Server-wide behaviour; rates are probabilities in [0, 1] drawn per request."""

    latency: float = 0.0
    fail_rate: float = 0.0
    rate_limit_rate: float = 0.0
    hang_rate: float = 0.0
    seed: int | None = None
    verbose: bool = False
    api_key: str | None = None
    flavour: str = "openai"
    throttle_seconds: float = 0.0
    throttle_retry_after: str | None = "1"
    rpm: int = 0
    tpm: int = 0
    limit_window: float = 60.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.latency) and self.latency >= 0):
            raise ValueError("latency must be a finite number >= 0")
        for name in ("fail_rate", "rate_limit_rate", "hang_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be within [0, 1]")
        if self.rpm < 0 or self.tpm < 0:
            raise ValueError("rpm and tpm must be >= 0 (0: no limit)")
        if not (math.isfinite(self.limit_window) and self.limit_window > 0):
            raise ValueError("limit_window must be a finite number > 0")
        if self.flavour not in FLAVOURS:
            raise ValueError(f"flavour must be one of: {', '.join(FLAVOURS)}")


@dataclass(frozen=True)
class Outcome:
    """How one request is answered."""

    kind: Literal["ok", "status", "malformed", "empty", "hang", "drip", "bytes", "nul",
                  "surrogate"] = "ok"
    status: int = 200
    retry_after: str | None = None
    amount: float = 0.0


class Markers:
    """Reads each request's markers against the server's knobs, and remembers what a marker that
    counts (`flaky`, `stream-cut`) has seen; safe to share between handler threads."""

    def __init__(self, config: FakeConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._rng = random.Random(config.seed)
        self._seen: dict[str, int] = {}

    def plan(self, text: str) -> tuple[float, Outcome]:
        """Turns the last user message into (extra latency, outcome), then applies random knobs."""
        latency, outcome = 0.0, None
        for token in _MARKER_RE.findall(text):
            if token.startswith("latency="):
                latency += nonneg_float(token[8:]) or 0.0
            elif outcome is None:
                outcome = self._marker_outcome(token, text)
        if outcome is None:
            cfg = self.config
            with self._lock:
                draw = self._rng.random()
            if draw < cfg.hang_rate:
                outcome = Outcome("hang")
            elif draw < cfg.hang_rate + cfg.rate_limit_rate:
                outcome = Outcome("status", 429, "1")
            elif draw < cfg.hang_rate + cfg.rate_limit_rate + cfg.fail_rate:
                outcome = Outcome("status", 500)
        return latency, outcome or Outcome()

    def stream_plan(self, text: str) -> tuple[float, int | None]:
        """A streamed answer's pace and cut: ``[fake:stream-gap=S]`` waits S seconds after each
        chunk; ``[fake:stream-cut=N]`` drops the connection after N chunks, the first time this
        exact text asks (later asks stream whole)."""
        gap, cut = 0.0, None
        for token in _MARKER_RE.findall(text):
            if token.startswith("stream-gap="):
                gap = nonneg_float(token[11:]) or 0.0
            elif token.startswith("stream-cut=") and token[11:].isdigit():
                cut = int(token[11:]) if self._count("cut:" + text) == 0 else None
        return gap, cut

    def _count(self, key: str) -> int:
        """How many times `key` was seen before this one."""
        with self._lock:
            seen = self._seen.get(key, 0)
            self._seen[key] = seen + 1
        return seen

    def _marker_outcome(self, token: str, text: str) -> Outcome | None:
        if token in ("malformed", "empty", "hang", "nul", "surrogate"):
            return Outcome(cast(Literal["malformed", "empty", "hang", "nul", "surrogate"], token))
        for kind in ("drip", "bytes"):
            if token.startswith(kind + "=") and (amount := nonneg_float(token[len(kind) + 1:])):
                return Outcome(kind, amount=amount)
        if token == "429":
            return Outcome("status", 429, "1")
        if token == "429-nohdr":
            return Outcome("status", 429)
        if token.startswith("429=") and nonneg_float(token[4:]) is not None:
            return Outcome("status", 429, token[4:])
        if token.isdigit() and (int(token) in _CLIENT_ERRORS or 500 <= int(token) <= 599):
            return Outcome("status", int(token))
        if token.startswith("flaky=") and token[6:].isdigit():
            return Outcome("status", 503) if self._count(text) < int(token[6:]) else None
        return None


def nonneg_float(text: str) -> float | None:
    """`text` as a finite number >= 0, else None."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None
