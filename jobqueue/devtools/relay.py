"""Passes `sa-core dev`'s children's log lines to its stderr: until the service is ready only what
is wrong (warnings, errors, anything that is not a log line), then everything."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections import deque
from typing import IO

__all__ = ["HELD_LINES", "Relay", "loud"]

HELD_LINES = 200
"""Lines held back during start-up and shown if the start fails."""

# NOTE: jobqueue/core/logs.py renders compact JSON (orjson: no space after a colon).
_QUIET = (b'"level":"info"', b'"level":"debug"')


def loud(line: bytes) -> bool:
    """True for a line shown even before ready: a warning, an error, or not one of our JSON lines
    (a traceback printed before logging was set up, a library writing to stderr)."""
    return not line.startswith(b"{") or not any(level in line for level in _QUIET)


class Relay:
    """One reader thread per child; `open()` when ready, `close()` after the children exited."""

    def __init__(self) -> None:
        self._opened = threading.Event()
        self._lock = threading.Lock()
        self._held: deque[bytes] = deque(maxlen=HELD_LINES)
        self._readers: list[threading.Thread] = []

    def follow(self, child: subprocess.Popen[bytes]) -> None:
        """Relays `child`'s stderr (it must have been started with stderr=PIPE)."""
        assert child.stderr is not None
        reader = threading.Thread(target=self._relay, args=(child.stderr,), daemon=True,
                                  name=f"sa-dev-relay-{child.pid}")
        reader.start()
        self._readers.append(reader)

    def open(self) -> None:
        """From now on every line is shown."""
        self._opened.set()

    def replay(self) -> None:
        """Shows the lines held back so far (a start that failed needs them)."""
        with self._lock:
            held, self._held = list(self._held), deque(maxlen=HELD_LINES)
            self._write(b"".join(held))

    def close(self) -> None:
        """Waits (briefly) for the readers to reach the end of their children's output."""
        for reader in self._readers:
            reader.join(timeout=5)

    def _relay(self, stream: IO[bytes]) -> None:
        for line in stream:
            with self._lock:
                if self._opened.is_set() or loud(line):
                    self._write(line)
                else:
                    self._held.append(line)

    @staticmethod
    def _write(data: bytes) -> None:
        if data:
            sys.stderr.buffer.write(data)
            sys.stderr.buffer.flush()
