"""Every error answer of the API, and the headers several answers carry, declared once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["LOCATION", "REPLAYED", "WAITED", "Error", "error_answer", "retry_after"]

_EXAMPLE_JOB_ID = "3f1c8d2e-5b7a-4c19-9e2f-0a6d4b8c7e51"


@dataclass(frozen=True)
class Error:
    """What an error status means for every route that answers it, and an example body."""

    description: str
    title: str
    detail: str
    headers: dict[str, Any] = field(default_factory=dict)


def retry_after(description: str | None = None, *, required: bool = True) -> dict[str, Any]:
    """The Retry-After header of an answer."""
    header: dict[str, Any] = {"description": description} if description else {}
    return {"Retry-After": {**header, "required": required, "schema": {"type": "string"}}}


LOCATION = {"Location": {"description": "The job's URL.", "required": True,
                         "schema": {"type": "string"}}}

REPLAYED = {"Idempotent-Replayed": {
    "description": "`true` when the answer replays an earlier submit with the same "
                   "Idempotency-Key (nothing new was queued).",
    "required": False, "schema": {"type": "string", "enum": ["true"]}}}

WAITED = {
    "Preference-Applied": {
        "description": "`wait=N` when the request waited for the job (RFC 7240).",
        "required": False, "schema": {"type": "string", "pattern": "^wait=[0-9]+$"}},
    "SA-Wait-Skipped": {
        "description": "`cap` when `Prefer: wait` was not applied: the token already has "
                       "SA_WAIT_MAX_PER_TOKEN waits in progress on this process, or the process "
                       "SA_WAIT_MAX. The prompt was accepted all the same; follow the job.",
        "required": False, "schema": {"type": "string", "enum": ["cap"]}},
}

ERRORS: dict[str, Error] = {
    "400": Error("Malformed request: the body is not JSON (or is empty), a header or query "
                 "parameter is malformed.", "Invalid parameter",
                 "The \"since\" parameter is invalid. must be an ISO 8601 timestamp"),
    "401": Error("No token, or the token is unknown, revoked or expired.", "Unauthorized",
                 "A valid bearer token is required.",
                 {"WWW-Authenticate": {"schema": {"type": "string", "const": "Bearer"},
                                       "required": True}}),
    "403": Error("The token lacks the scope the route needs (`ops`), or a session cookie came "
                 "from another origin or without X-SA-Session on a write.", "Forbidden",
                 "This route needs a token with the ops scope."),
    "404": Error("No such object in the caller's org. Another org's objects, and malformed ids, "
                 "answer exactly like missing ones.", "Not found",
                 f"job {_EXAMPLE_JOB_ID} not found"),
    "409": Error("The object's state forbids the action (terminal job, or a job still active).",
                 "Conflict", f"job {_EXAMPLE_JOB_ID} is succeeded"),
    "413": Error("The body is larger than SA_MAX_BODY_BYTES (default 1 MiB).",
                 "Request body too large", "The body is larger than 1048576 bytes."),
    "415": Error("A body was sent that is not `application/json` (UTF-8).",
                 "Unsupported media type", "Send the body as application/json."),
    "422": Error("The body is JSON but not acceptable: a field is missing, unknown, of the wrong "
                 "type or out of range (the description names it).", "Invalid field",
                 "priority: must be between 0 and 100"),
    "429": Error("Too many requests; retry after Retry-After seconds.", "Too many requests",
                 "Try again later.", retry_after("Seconds to wait.")),
    "503": Error("The database is unreachable; retry shortly (after Retry-After seconds, when "
                 "sent).", "Database unavailable", "OperationalError",
                 retry_after(required=False)),
}


def error_answer(code: str, description: str | None = None,
                 headers: dict[str, Any] | None = None) -> dict[str, Any]:
    """The answer object of error `code`; a route may say more precisely what it means there."""
    error = ERRORS[code]
    answer: dict[str, Any] = {
        "description": description or error.description,
        "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/Error"},
            "example": {"title": error.title, "description": error.detail}}},
    }
    headers = error.headers if headers is None else headers
    if headers:
        answer["headers"] = headers
    return answer
