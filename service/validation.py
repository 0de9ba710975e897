"""Validation of request bodies and parameters, before any SQL runs."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import falcon

__all__ = ["PromptRequest", "parse_prompt", "parse_since"]

PROMPT_FIELDS = frozenset({"text", "parent_id", "priority", "max_attempts", "options"})
MAX_ATTEMPTS_LIMIT = 10
MAX_DEPTH = 50
MAX_MODEL_CHARS = 200


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


def _int_field(body: dict[str, Any], field: str, default: int, low: int, high: int) -> int:
    value = body.get(field, default)
    # NOTE: bool is an int subclass; `true` is not a priority.
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
    return value


def _options(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _invalid("options", "must be an object")
    unknown = sorted(set(value) - {"model", "depth"})
    if unknown:
        raise _invalid("options", f"unknown keys {', '.join(unknown)} (allowed: model, depth)")
    options: dict[str, Any] = {}
    if "model" in value:
        options["model"] = _text(value["model"], "options.model", MAX_MODEL_CHARS)
    if "depth" in value:
        options["depth"] = _int_field(value, "depth", 0, 0, MAX_DEPTH)
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
        try:
            parent_id = uuid.UUID(raw) if isinstance(raw, str) else None
        except ValueError:
            parent_id = None
        if parent_id is None:
            raise _invalid("parent_id", "must be a UUID string")
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
        since = datetime.fromisoformat(raw)
    except ValueError:
        raise falcon.HTTPInvalidParam("must be an ISO 8601 timestamp", "since") from None
    return since if since.tzinfo is not None else since.replace(tzinfo=UTC)
