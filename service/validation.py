"""Validation of request bodies and parameters, before any SQL runs."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import falcon

from jobqueue.engine.claim import MAX_DEPTH
from jobqueue.engine.idempotency import MAX_KEY_LENGTH

__all__ = [
    "MAX_ATTEMPTS_LIMIT",
    "MAX_DEPTH",
    "MAX_MODEL_CHARS",
    "OPTION_KEYS",
    "SINCE_PATTERN",
    "UUID_PATTERN",
    "PromptRequest",
    "parse_idempotency_key",
    "parse_no_body",
    "parse_prompt",
    "parse_since",
]

PROMPT_FIELDS = frozenset({"text", "parent_id", "priority", "max_attempts", "options"})
OPTION_KEYS = ("depth", "model")
MAX_ATTEMPTS_LIMIT = 10
MAX_MODEL_CHARS = 200

UUID_PATTERN = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
"""The only spelling of a UUID accepted in a body (`uuid.UUID` alone also takes braces, URNs...)."""

SINCE_PATTERN = (
    r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
    r"([T ]([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9]([.][0-9]{1,6})?)?(Z|[+-][01][0-9]:[0-5][0-9])?)?$"
)
"""What `since` may look like: an ISO 8601 date or date-time, offset optional (none means UTC).

A string of this shape that names no real instant (February 30th, year 0) answers 400 too.
"""

_UUID_RE = re.compile(UUID_PATTERN)
_SINCE_RE = re.compile(SINCE_PATTERN)
# NOTE: visible ASCII only, so a key is the same bytes in every client, log-safe and header-safe.
# Every pattern is used with fullmatch: a bare `$` would also match before a trailing newline.
_KEY_RE = re.compile(r"^[\x21-\x7e]+$")


@dataclass(frozen=True)
class PromptRequest:
    """A validated POST /prompt body."""

    text: str
    parent_id: uuid.UUID | None
    priority: int
    max_attempts: int
    options: dict[str, Any]


def _invalid(field: str, why: str) -> falcon.HTTPUnprocessableEntity:
    return falcon.HTTPUnprocessableEntity(title="Invalid field", description=f"{field}: {why}")


def _int_field(body: dict[str, Any], field: str, default: int, low: int, high: int,
               label: str | None = None) -> int:
    value = body.get(field, default)
    field = label or field
    # NOTE: bool is an int subclass; `true` is not a priority. A float with no fraction (5.0,
    # 1e2) is an integer in JSON Schema's sense (and the OpenAPI document's), so it is taken.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(field, "must be an integer")
    if not low <= value <= high:
        raise _invalid(field, f"must be between {low} and {high}")
    return value


def _text(value: object, field: str, max_chars: int) -> str:
    if not isinstance(value, str):
        raise _invalid(field, "must be a string")
    if not value.strip():
        raise _invalid(field, "must not be empty")
    if len(value) > max_chars:
        raise _invalid(field, f"must be at most {max_chars} characters")
    if "\x00" in value:
        raise _invalid(field, "must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        # NOTE: JSON may spell a lone surrogate (\ud800); Postgres text cannot store one.
        raise _invalid(field, "must be valid Unicode (no lone surrogate escapes)") from None
    return value


def _options(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _invalid("options", "must be an object")
    unknown = sorted(set(value) - set(OPTION_KEYS))
    if unknown:
        raise _invalid(f"options.{unknown[0]}",
                       f"unknown option (allowed: {', '.join(OPTION_KEYS)})")
    options: dict[str, Any] = {}
    if "model" in value:
        options["model"] = _text(value["model"], "options.model", MAX_MODEL_CHARS)
    if "depth" in value:
        options["depth"] = _int_field(value, "depth", 0, 0, MAX_DEPTH, label="options.depth")
    return options


def parse_prompt(body: object, max_chars: int) -> PromptRequest:
    """Validates a POST /prompt body.

    Raises:
        falcon.HTTPUnprocessableEntity: a field is missing, unknown or out of range.
    """
    if not isinstance(body, dict):
        raise falcon.HTTPUnprocessableEntity(
            title="Invalid body", description="The body must be a JSON object."
        )
    unknown = sorted(set(body) - PROMPT_FIELDS)
    if unknown:
        raise _invalid(unknown[0], "unknown field")
    if "text" not in body:
        raise _invalid("text", "is required")
    parent_id = None
    if body.get("parent_id") is not None:
        raw = body["parent_id"]
        if not isinstance(raw, str) or not _UUID_RE.fullmatch(raw):
            raise _invalid("parent_id", "must be a UUID string (8-4-4-4-12 hex digits)")
        parent_id = uuid.UUID(raw)
    return PromptRequest(
        text=_text(body["text"], "text", max_chars),
        parent_id=parent_id,
        priority=_int_field(body, "priority", 50, 0, 100),
        max_attempts=_int_field(body, "max_attempts", 3, 1, MAX_ATTEMPTS_LIMIT),
        options=_options(body.get("options", {})),
    )


def parse_since(raw: str | None) -> datetime | None:
    """Parses the `since` cursor (ISO 8601; naive means UTC).

    Raises:
        falcon.HTTPInvalidParam: not an ISO 8601 timestamp.
    """
    if raw is None:
        return None
    try:
        if not _SINCE_RE.fullmatch(raw):
            raise ValueError(raw)
        since = datetime.fromisoformat(raw)
    except ValueError:
        raise falcon.HTTPInvalidParam("must be an ISO 8601 timestamp", "since") from None
    return since if since.tzinfo is not None else since.replace(tzinfo=UTC)


def parse_idempotency_key(raw: str | None) -> str | None:
    """Validates the `Idempotency-Key` header (absent means no key).

    Raises:
        falcon.HTTPInvalidHeader: empty, longer than 255 characters, or not visible ASCII.
    """
    if raw is None:
        return None
    if len(raw) > MAX_KEY_LENGTH or not _KEY_RE.fullmatch(raw):
        raise falcon.HTTPInvalidHeader(
            f"must be 1 to {MAX_KEY_LENGTH} visible ASCII characters (a UUID is a good key)",
            "Idempotency-Key")
    return raw


def parse_no_body(body: object) -> None:
    """Validates the body of a route that takes none: absent, or an empty JSON object.

    Raises:
        falcon.HTTPUnprocessableEntity: the body holds anything else.
    """
    if body is None or body == {}:
        return
    if isinstance(body, dict):
        raise _invalid(sorted(body)[0], "unknown field (this route takes no body)")
    raise falcon.HTTPUnprocessableEntity(
        title="Invalid body", description="This route takes no body (or an empty JSON object).")
