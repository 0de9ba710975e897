"""JSON encoding of the values rows hold beyond JSON's own types: UUIDs and timestamps."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

__all__ = ["json_default"]


def json_default(value: Any) -> Any:
    """`json.dumps(default=...)` hook: UUIDs as strings, timestamps as ISO 8601.

    Raises:
        TypeError: any other type, as json.dumps expects.
    """
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
