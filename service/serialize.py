"""JSON encoding for rows that hold UUIDs and timestamps."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from functools import partial
from typing import Any

import falcon.media

__all__ = ["json_handler"]


def _default(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def json_handler() -> falcon.media.JSONHandler:
    """Returns Falcon's JSON handler taught to write UUIDs and ISO 8601 timestamps."""
    return falcon.media.JSONHandler(
        dumps=partial(json.dumps, default=_default, separators=(",", ":")),
        loads=json.loads,
    )
