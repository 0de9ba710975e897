"""One log stream: every line, from structlog or from any stdlib logger (psycopg_pool, gunicorn), is
one JSON object on stderr, filtered by LOG_LEVEL."""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping, MutableMapping
from typing import Any

import orjson
import structlog

__all__ = ["FLUSH_INTERVAL", "LEVELS", "LineLogger", "LogLevelError", "configure_logging", "level_from_env"]

# NOTE: this module must not import psycopg (nor anything that does): gunicorn's master loads it
# through service/gunicorn_conf.py before its gevent workers patch the stdlib, and psycopg picks
# its wait function (blocking or gevent-aware) once, at import.

FLUSH_INTERVAL = 0.1
"""Seconds an info line may wait in the buffer; warnings and errors are written at once."""

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR, "critical": logging.CRITICAL}
"""The values LOG_LEVEL takes (any case)."""


class LineLogger:
    """Writes rendered lines to the current sys.stderr without flushing; a daemon thread flushes
    it every FLUSH_INTERVAL, and warnings, errors and process exit flush at once.

    PERF: structlog's PrintLogger flushes every line, a write(2) and a GIL release per log call;
    with 32 job threads logging three lines per job those handoffs cost a quarter of a worker's
    CPU. The price: a process killed outright (SIGKILL, OOM) loses at most FLUSH_INTERVAL of info
    lines. Logs go to stderr so that stdout carries only a command's answer (`sa-core list-jobs
    --json | jq`); writing through sys.stderr (not its byte buffer) keeps the lines in order with
    the CLI's one-line errors.

    With `buffered` False (the web process) every line is flushed as it is written and no thread
    is ever started. gunicorn's gevent worker logs "Booting worker" before it monkey-patches the
    stdlib: a flusher started by that line is a native thread that outlives the patch, then waits
    on gevent's locks and builds a gevent hub of its own; when the main thread builds its hub at
    the same moment, both import through importlib's module locks (gevent locks by then) and
    deadlock, and the worker never serves (seen under load, about once in twenty starts). A web
    request costs far more than one write(2).
    """

    def __init__(self) -> None:
        self.buffered = True
        self._pending = threading.Event()
        self._flusher: threading.Thread | None = None
        self._flushing = threading.Lock()
        atexit.register(self._flush)
        # NOTE: a thread does not survive a fork, so a forked child starts its own flusher on its
        # first line. A fork while the parent's flusher was inside sys.stderr.flush() would hand the
        # child stderr's buffer lock held for ever (its first log line would hang): the fork waits
        # for the flush.
        os.register_at_fork(before=lambda: self._flushing.acquire(),
                            after_in_parent=lambda: self._flushing.release(),
                            after_in_child=self._forget_flusher)

    def info(self, message: str) -> None:
        """Buffers one line (writes it through when not `buffered`)."""
        sys.stderr.write(message + "\n")
        if not self.buffered:
            self._flush()
        elif not self._pending.is_set():
            if self._flusher is None:
                self._start_flusher()
            self._pending.set()

    def warning(self, message: str) -> None:
        """Writes one line and flushes."""
        self.info(message)
        self._flush()

    debug = info
    msg = info
    error = exception = critical = warning

    def _forget_flusher(self) -> None:
        self._flusher = None
        self._pending = threading.Event()
        self._flushing = threading.Lock()

    def _start_flusher(self) -> None:
        self._flusher = threading.Thread(target=self._flush_forever, name="sa-log-flush", daemon=True)
        self._flusher.start()

    def _flush(self) -> None:
        # NOTE: stderr closed or gone (a reader hung up); logging must never kill the process.
        with self._flushing, contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()

    def _flush_forever(self) -> None:
        # NOTE: sleeps while nothing is written, so an idle process does not wake up for logs.
        pending = self._pending
        while pending.wait():
            time.sleep(FLUSH_INTERVAL)
            pending.clear()
            self._flush()


_LOGGER: LineLogger | None = None


def _line_logger(*_args: Any) -> LineLogger:
    global _LOGGER
    if _LOGGER is None:
        _LOGGER = LineLogger()
    return _LOGGER


def _render(obj: Any, default: Any = None) -> str:
    """A log line's JSON, by orjson; the stdlib's, just as compact, for what orjson refuses (an
    integer past 64 bits, a lone surrogate), so every line reads the same to a grep or the relay.

    PERF: json.dumps behind structlog's renderer cost 12.6 us of a 30 us line; a worker writes
    three lines a job (docs/performance.md).
    """
    try:
        return orjson.dumps(obj, default=default, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return json.dumps(obj, default=default, separators=(",", ":"))


def _timestamp(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Adds `timestamp`, ISO 8601 in UTC to the microsecond, as structlog's TimeStamper writes it.

    PERF: the date and time to the second are formatted once a second, not for every line
    (TimeStamper's datetime.isoformat: 5.8 us a line).
    """
    global _second
    now = time.time()
    second = int(now)
    cached = _second
    if cached[0] != second:
        # NOTE: one tuple, replaced whole: a thread never reads one second's date with another's.
        cached = _second = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
    event["timestamp"] = f"{cached[1]}.{int((now - second) * 1_000_000):06d}Z"
    return event


_second: tuple[int, str] = (-1, "")


class LogLevelError(ValueError):
    """LOG_LEVEL names no level."""


class _JsonHandler(logging.Handler):
    """Renders stdlib records (psycopg_pool, gunicorn, ...) as the same JSON lines, through LineLogger."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:  # NOTE: logging's own contract: a bad record must not kill the caller.
            self.handleError(record)
            return
        out = _line_logger()
        (out.warning if record.levelno >= logging.WARNING else out.info)(line)


def level_from_env(environ: Mapping[str, str] | None = None, default: int = logging.INFO) -> int:
    """Returns the level LOG_LEVEL names, `default` when it is unset or empty.

    Raises:
        LogLevelError: LOG_LEVEL names no level.
    """
    text = (os.environ if environ is None else environ).get("LOG_LEVEL", "").strip().lower()
    if not text:
        return default
    if text not in LEVELS:
        raise LogLevelError(f"LOG_LEVEL={text!r} is not one of {', '.join(LEVELS)}")
    return LEVELS[text]


def configure_logging(level: int | None = None, *, buffered: bool = True,
                      default: int = logging.INFO) -> None:
    """Routes structlog and the stdlib's root logger to stderr as JSON lines; idempotent.

    Args:
        level: the lowest level written; LOG_LEVEL (else `default`) when None.
        buffered: False writes every line through and starts no thread (LineLogger says when).
        default: the level when LOG_LEVEL is unset: info for the processes that serve, warning
            for one-shot commands, whose answer is on stdout (jobqueue/operator/cli.py).

    Raises:
        LogLevelError: LOG_LEVEL names no level.
    """
    level = level_from_env(default=default) if level is None else level
    _line_logger().buffered = buffered
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            _timestamp,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(serializer=_render),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=_line_logger,
        cache_logger_on_first_use=True,
    )
    handler = _JsonHandler()
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            _timestamp,
            structlog.stdlib.ExtraAdder(),
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(serializer=_render),
        ],
    ))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _JsonHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
