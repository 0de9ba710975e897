"""Validation of request bodies and parameters, before any SQL runs."""

from __future__ import annotations

import base64
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import falcon

from jobqueue.engine.claim import MAX_DEPTH
from jobqueue.engine.idempotency import MAX_KEY_LENGTH

__all__ = [
    "CURSOR_PATTERN",
    "EVENT_ID_PATTERN",
    "MAX_ATTEMPTS_LIMIT",
    "MAX_DEPTH",
    "MAX_EVENT_ID",
    "MAX_MODEL_CHARS",
    "OPTION_KEYS",
    "RECENT_LIMIT_DEFAULT",
    "RECENT_LIMIT_MAX",
    "SCOPES",
    "SINCE_PATTERN",
    "UUID_PATTERN",
    "PromptRequest",
    "encode_cursor",
    "parse_cursor",
    "parse_event_id",
    "parse_idempotency_key",
    "parse_no_body",
    "parse_org_wide",
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

RECENT_LIMIT_DEFAULT = 100
RECENT_LIMIT_MAX = 500

MAX_EVENT_ID = 2**63 - 1
"""The largest event id (sa_job_event.id is a bigint)."""

EVENT_ID_PATTERN = "^[0-9]{1,19}$"
"""What Last-Event-ID may look like: a decimal event id (at most MAX_EVENT_ID)."""

CURSOR_PATTERN = "^[A-Za-z0-9_-]{11}$"
"""A /mission/recent cursor: opaque to clients (it is an event id, base64url of 8 bytes)."""

SCOPES = ("user", "org")
"""`scope` of the mission feeds: the viewer's own prompts (default) or the viewer's whole org."""

_UUID_RE = re.compile(UUID_PATTERN)
_EVENT_ID_RE = re.compile(EVENT_ID_PATTERN)
_CURSOR_RE = re.compile(CURSOR_PATTERN)
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


def parse_event_id(raw: str, name: str, header: bool = False) -> int:
    """Parses an event id given as Last-Event-ID (a header) or `last_event_id` (a parameter).

    Raises:
        falcon.HTTPInvalidHeader: a malformed or out-of-range header.
        falcon.HTTPInvalidParam: a malformed or out-of-range parameter.
    """
    raw = raw.strip()
    # NOTE: the length is checked before int() ever runs: a 4,300-digit string is refused
    # cheaply, never converted (Python refuses such conversions with a ValueError of its own).
    if _EVENT_ID_RE.fullmatch(raw) and int(raw) <= MAX_EVENT_ID:
        return int(raw)
    why = f"must be an event id (an integer from 0 to {MAX_EVENT_ID})"
    raise falcon.HTTPInvalidHeader(why, name) if header else falcon.HTTPInvalidParam(why, name)


def encode_cursor(event_id: int) -> str:
    """Returns the opaque cursor that continues after `event_id`."""
    return base64.urlsafe_b64encode(event_id.to_bytes(8, "big")).decode().rstrip("=")


def parse_cursor(raw: str | None) -> int | None:
    """Parses a `cursor` from a previous /mission/recent answer (absent means a first call).

    Raises:
        falcon.HTTPInvalidParam: not a cursor this service hands out.
    """
    if raw is None:
        return None
    if not _CURSOR_RE.fullmatch(raw):
        raise falcon.HTTPInvalidParam("must be the `next_cursor` of a previous answer", "cursor")
    # NOTE: every string of the documented shape decodes; one beyond the largest id only
    # means "nothing newer yet".
    return min(int.from_bytes(base64.urlsafe_b64decode(raw + "="), "big"), MAX_EVENT_ID)


def parse_org_wide(raw: str | None) -> bool:
    """Parses `scope`: `user` (the default, the viewer's own) or `org` (the viewer's whole org).

    Raises:
        falcon.HTTPInvalidParam: any other value.
    """
    if raw is None or raw == SCOPES[0]:
        return False
    if raw == SCOPES[1]:
        return True
    raise falcon.HTTPInvalidParam(f"must be one of: {', '.join(SCOPES)}", "scope")


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
