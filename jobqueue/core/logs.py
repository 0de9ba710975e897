"""structlog setup: one JSON object per line on stdout, with event names and bound ids."""

from __future__ import annotations

import atexit
import contextlib
import logging
import sys
import threading
import time
from typing import Any

import structlog

__all__ = ["FLUSH_INTERVAL", "LineLogger", "configure_logging"]

FLUSH_INTERVAL = 0.1
"""Seconds an info line may wait in the buffer; warnings and errors are written at once."""


class LineLogger:
    """Writes rendered lines to the current sys.stdout without flushing; a daemon thread flushes
    it every FLUSH_INTERVAL, and warnings, errors and process exit flush at once.

    PERF: structlog's PrintLogger flushes every line, a write(2) and a GIL release per log call;
    with 32 job threads logging three lines per job those handoffs cost a quarter of a worker's
    CPU. The price: a process killed outright (SIGKILL, OOM) loses at most FLUSH_INTERVAL of info
    lines. Writing through sys.stdout (not its byte buffer) keeps log lines in order with what
    the CLI prints.
    """

    def __init__(self) -> None:
        self._pending = threading.Event()
        threading.Thread(target=self._flush_forever, name="sa-log-flush", daemon=True).start()
        atexit.register(self._flush)

    def info(self, message: str) -> None:
        """Buffers one line."""
        sys.stdout.write(message + "\n")
        if not self._pending.is_set():
            self._pending.set()

    def warning(self, message: str) -> None:
        """Writes one line and flushes."""
        self.info(message)
        self._flush()

    debug = info
    msg = info
    error = exception = critical = warning

    @staticmethod
    def _flush() -> None:
        # NOTE: stdout closed or gone (a reader hung up); logging must never kill the process.
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()

    def _flush_forever(self) -> None:
        # NOTE: sleeps while nothing is written, so an idle process does not wake up for logs.
        while self._pending.wait():
            time.sleep(FLUSH_INTERVAL)
            self._pending.clear()
            self._flush()


_LOGGER: LineLogger | None = None


def _line_logger(*_args: Any) -> LineLogger:
    global _LOGGER
    if _LOGGER is None:
        _LOGGER = LineLogger()
    return _LOGGER


def configure_logging(level: int = logging.INFO) -> None:
    """Routes structlog to stdout as JSON lines; idempotent."""
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=_line_logger,
        cache_logger_on_first_use=True,
    )
