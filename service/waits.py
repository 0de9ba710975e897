"""Admission of requests that hold their connection while a job runs: at most so many per token
and per process, so waits can never take every connection of a web process.

Any route that waits for a job (`Prefer: wait` on POST /prompt, the OpenAI front door's chat)
takes a slot first::

    with waits.admit(req.context.token_digest) as slot:
        if slot is None:
            ...  # over a cap: answer at once (202), or 429 with Retry-After for a pure wait
        ...      # wait (the hub's `watching`), holding the slot

NOTE: the slot is held for the whole wait and given back however the request ends.
"""

from __future__ import annotations

import contextlib
import threading
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

import structlog

__all__ = ["RETRY_AFTER_SECONDS", "Slot", "Waits"]

log = structlog.get_logger(__name__)

RETRY_AFTER_SECONDS = 1
"""What a route that refuses a pure wait with 429 says in Retry-After: a wait slot frees as soon
as one job ends or one wait times out."""


@dataclass(frozen=True, slots=True)
class Slot:
    """A wait admitted under the caps; `held` counts the token's waits, this one included."""

    token: bytes
    held: int


class Waits:
    """The waits of one web process, counted per token digest and in all."""

    def __init__(self, per_token: int, per_process: int) -> None:
        if per_token < 1 or per_process < 1:
            raise ValueError("the wait caps must be at least 1")
        self._per_token = per_token
        self._per_process = per_process
        self._lock = threading.Lock()
        self._held: dict[bytes, int] = defaultdict(int)
        self._total = 0

    @property
    def held(self) -> int:
        """Waits in progress in this process."""
        with self._lock:
            return self._total

    @contextlib.contextmanager
    def admit(self, token: bytes) -> Iterator[Slot | None]:
        """Yields a slot for one wait by `token`, or None when the token (SA_WAIT_MAX_PER_TOKEN)
        or the process (SA_WAIT_MAX) already holds its cap."""
        with self._lock:
            refused = ("token" if self._held[token] >= self._per_token else
                       "process" if self._total >= self._per_process else None)
            if refused is None:
                self._held[token] += 1
                self._total += 1
                slot = Slot(token, self._held[token])
            elif not self._held[token]:
                del self._held[token]
        if refused is not None:
            log.info("http.wait_refused", cap=refused, waits=self.held)
            yield None
            return
        try:
            yield slot
        finally:
            with self._lock:
                self._total -= 1
                self._held[token] -= 1
                if not self._held[token]:
                    del self._held[token]
