"""structlog setup: one JSON object per line on stdout, with event names and bound ids."""

from __future__ import annotations

import logging

import structlog

__all__ = ["configure_logging"]


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
        logger_factory=structlog.PrintLoggerFactory(),
        cache_logger_on_first_use=True,
    )
