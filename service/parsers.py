"""The parsers of headers, query parameters and cursors: each reads one value as the contract
(`service/contract.py`) declares it, and answers the 400 that names it otherwise."""

from __future__ import annotations

import base64
import re
import uuid
from datetime import UTC, datetime, timedelta

import falcon

from service.contract import (
    CURSOR,
    CURSOR_PATTERN,
    EVENT_ID_PATTERN,
    IDEMPOTENCY_KEY,
    JOBS_CURSOR,
    JOBS_CURSOR_PATTERN,
    KEY_PATTERN,
    LAST_EVENT_ID,
    LAST_EVENT_ID_HEADER,
    MAX_EVENT_ID,
    MAX_KEY_LENGTH,
    MAX_WAIT_SECONDS,
    PREFER,
    PREFER_PATTERN,
    SCOPE,
    SCOPES,
    SINCE,
)
from service.schema import SINCE_PATTERN, Param

__all__ = [
    "encode_cursor",
    "encode_jobs_cursor",
    "parse_cursor",
    "parse_event_id",
    "parse_idempotency_key",
    "parse_jobs_cursor",
    "parse_last_event_id",
    "parse_limit",
    "parse_org_wide",
    "parse_prefer_wait",
    "parse_since",
]

_EVENT_ID_RE = re.compile(EVENT_ID_PATTERN)
_CURSOR_RE = re.compile(CURSOR_PATTERN)
_JOBS_CURSOR_RE = re.compile(JOBS_CURSOR_PATTERN)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROS_MIN = (datetime.min.replace(tzinfo=UTC) - _EPOCH) // timedelta(microseconds=1)
_MICROS_MAX = (datetime.max.replace(tzinfo=UTC) - _EPOCH) // timedelta(microseconds=1)
_SINCE_RE = re.compile(SINCE_PATTERN)
_KEY_RE = re.compile(KEY_PATTERN)
_PREFER_RE = re.compile(PREFER_PATTERN)


def parse_prefer_wait(raw: str | None) -> int:
    """Parses `Prefer: wait=N`; absent means 0 (answer at once).

    Raises:
        falcon.HTTPInvalidHeader: anything but `wait=N` with N from 0 to MAX_WAIT_SECONDS.
    """
    if raw is None:
        return 0
    match = _PREFER_RE.fullmatch(raw)
    if match is None:
        raise falcon.HTTPInvalidHeader(f"must be wait=N, N from 0 to {MAX_WAIT_SECONDS}",
                                       PREFER.name)
    return int(match.group(1))


def parse_since(raw: str | None) -> datetime | None:
    """Parses the `since` cursor (ISO 8601; naive means UTC).

    Raises:
        falcon.HTTPInvalidParam: not a real ISO 8601 date or date-time.
    """
    if raw is None:
        return None
    if not _SINCE_RE.fullmatch(raw):
        raise falcon.HTTPInvalidParam("must be an ISO 8601 timestamp", SINCE.name)
    since = datetime.fromisoformat(raw)
    return since.astimezone(UTC) if since.tzinfo is not None else since.replace(tzinfo=UTC)


def parse_limit(req: falcon.Request, param: Param) -> int:
    """Parses the `limit` query parameter `param` declares (absent means its default).

    Raises:
        falcon.HTTPInvalidParam: not an integer within the documented bounds.
    """
    limit = req.get_param_as_int(param.name, min_value=param.schema["minimum"],
                                 max_value=param.schema["maximum"],
                                 default=param.schema["default"])
    assert limit is not None
    return limit


def parse_event_id(raw: str, name: str, header: bool = False) -> int:
    """Parses an event id given as Last-Event-ID (a header) or `last_event_id` (a parameter).

    Raises:
        falcon.HTTPInvalidHeader: a malformed or out-of-range header.
        falcon.HTTPInvalidParam: a malformed or out-of-range parameter.
    """
    # NOTE: a header's surrounding blanks are HTTP's, not the value's; a parameter has none.
    raw = raw.strip() if header else raw
    # NOTE: the length is checked before int() ever runs: a 4,300-digit string is refused
    # cheaply, never converted (Python refuses such conversions with a ValueError of its own).
    if _EVENT_ID_RE.fullmatch(raw) and int(raw) <= MAX_EVENT_ID:
        return int(raw)
    why = f"must be an event id (an integer from 0 to {MAX_EVENT_ID})"
    raise falcon.HTTPInvalidHeader(why, name) if header else falcon.HTTPInvalidParam(why, name)


def parse_last_event_id(req: falcon.Request) -> int | None:
    """The Last-Event-ID header (sent by a reconnecting EventSource), else `?last_event_id=`.

    Both are checked when both are sent: the header wins, but a malformed parameter is a 400
    all the same.

    Raises:
        falcon.HTTPInvalidHeader: a malformed or out-of-range header.
        falcon.HTTPInvalidParam: a malformed or out-of-range parameter.
    """
    param = req.get_param(LAST_EVENT_ID.name)
    from_param = None if param is None else parse_event_id(param, LAST_EVENT_ID.name)
    raw = req.get_header(LAST_EVENT_ID_HEADER.name)
    if raw is not None and raw.strip():
        return parse_event_id(raw, LAST_EVENT_ID_HEADER.name, header=True)
    return from_param


def encode_cursor(event_id: int) -> str:
    """Returns the opaque cursor that continues after `event_id`."""
    return base64.urlsafe_b64encode(event_id.to_bytes(8, "big")).decode().rstrip("=")


def parse_cursor(raw: str | None, name: str = CURSOR.name) -> int | None:
    """Parses a `cursor` from a previous /mission/recent answer (absent means a first call), or
    the `before` of a previous /mission/prompts answer (`name`).

    Raises:
        falcon.HTTPInvalidParam: not a cursor this service hands out.
    """
    if raw is None:
        return None
    if not _CURSOR_RE.fullmatch(raw):
        raise falcon.HTTPInvalidParam(f"must be the `next_{name}` of a previous answer", name)
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
    raise falcon.HTTPInvalidParam(f"must be one of: {', '.join(SCOPES)}", SCOPE.name)


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
            IDEMPOTENCY_KEY.name)
    return raw


def encode_jobs_cursor(created_at: datetime, job_id: uuid.UUID) -> str:
    """Returns the opaque cursor that continues a prompt's jobs after this one (older ones)."""
    micros = (created_at - _EPOCH) // timedelta(microseconds=1)
    raw = micros.to_bytes(8, "big", signed=True) + job_id.bytes
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def parse_jobs_cursor(raw: str | None) -> tuple[datetime, uuid.UUID] | None:
    """Parses a `cursor` from a previous GET /prompts/{id} answer (absent means the newest jobs).

    Raises:
        falcon.HTTPInvalidParam: not a cursor this service hands out.
    """
    if raw is None:
        return None
    if not _JOBS_CURSOR_RE.fullmatch(raw):
        raise falcon.HTTPInvalidParam("must be the `next_cursor` of a previous answer",
                                      JOBS_CURSOR.name)
    data = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
    # NOTE: every string of the documented shape decodes: a time past the calendar's ends only
    # means "before (or after) every job".
    micros = min(max(int.from_bytes(data[:8], "big", signed=True), _MICROS_MIN), _MICROS_MAX)
    return _EPOCH + timedelta(microseconds=micros), uuid.UUID(bytes=data[8:24])
