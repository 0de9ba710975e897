"""The OpenAPI 3.1 document of the HTTP API, served at /sa-core/v1/openapi.json.

Written by hand, next to the validators it describes: the bounds below are the ones
`service.validation` enforces (imported, not repeated), and `tests/test_openapi.py` fails when a
route of the app is missing here or a documented one is not served. Schemathesis checks every
answer against it.
"""

from __future__ import annotations

from typing import Any

import falcon

from jobqueue.core.policy import ErrorKind
from jobqueue.core.settings import KEY_TTL_SECONDS, Settings
from jobqueue.engine.enqueue import QUEUE_FULL_RETRY_AFTER
from jobqueue.engine.idempotency import MAX_KEY_LENGTH
from service.auth import API_PREFIX
from service.validation import (
    CURSOR_PATTERN,
    EVENT_ID_PATTERN,
    MAX_ATTEMPTS_LIMIT,
    MAX_DEPTH,
    MAX_EVENT_ID,
    MAX_MODEL_CHARS,
    RECENT_LIMIT_DEFAULT,
    RECENT_LIMIT_MAX,
    SCOPES,
    SINCE_PATTERN,
    UUID_PATTERN,
)

__all__ = ["OPENAPI_PATH", "OpenApiDocument", "build_openapi"]

OPENAPI_PATH = f"{API_PREFIX}/openapi.json"

Schema = dict[str, Any]

JOB_STATES = ["queued", "running", "succeeded", "failed", "cancelled", "superseded"]
ERROR_KINDS = [kind.value for kind in ErrorKind]


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


_UUID: Schema = {"type": "string", "format": "uuid"}
_TIME: Schema = {"type": "string", "format": "date-time"}
_COUNT: Schema = {"type": "integer", "minimum": 0}


def _error(description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": _ref("Error")}},
    }
    if headers:
        answer["headers"] = headers
    return answer


_ERRORS: dict[str, dict[str, Any]] = {
    "400": _error("Malformed request: the body is not JSON (or is empty), a header or query "
                  "parameter is malformed."),
    "401": _error("No token, or the token is unknown, revoked or expired.", {
        "WWW-Authenticate": {"schema": {"type": "string", "const": "Bearer"}, "required": True}}),
    "404": _error("No such object in the caller's org. Another org's objects, and malformed ids, "
                  "answer exactly like missing ones."),
    "409": _error("The object's state forbids the action (terminal job, or a job still active)."),
    "413": _error("The body is larger than SA_MAX_BODY_BYTES (default 1 MiB)."),
    "415": _error("A body was sent that is not `application/json` (UTF-8)."),
    "422": _error("The body is JSON but not acceptable: a field is missing, unknown, of the "
                  "wrong type or out of range (the description names it)."),
    "503": _error("The database is unreachable; retry shortly (after Retry-After seconds, when sent).", {
        "Retry-After": {"schema": {"type": "string"}, "required": False}}),
}


def _errors(*codes: str) -> dict[str, dict[str, Any]]:
    return {code: _ERRORS[code] for code in codes}


def _json(description: str, schema: Schema, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = {"description": description,
                              "content": {"application/json": {"schema": schema}}}
    if headers:
        answer["headers"] = headers
    return answer


def _path_id(name: str, what: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "description": f"The {what}'s id.",
            "schema": _UUID}


_NO_BODY: dict[str, Any] = {
    "required": False,
    "description": "No body is needed; an empty JSON object is accepted, anything else is a 422.",
    "content": {"application/json": {"schema": {"type": "object", "maxProperties": 0}}},
}

_LOCATION = {"Location": {"description": "The job's URL.", "required": True,
                          "schema": {"type": "string"}}}


_SCOPE: dict[str, Any] = {
    "name": "scope", "in": "query", "required": False,
    "description": "`user`: the caller's own prompts (the default); `org`: every prompt of the "
                   "caller's org (an explicit opt-in).",
    "schema": {"type": "string", "enum": list(SCOPES), "default": SCOPES[0]}}


def _schemas(settings: Settings) -> dict[str, Schema]:
    non_blank = "\\S"
    return {
        "Error": {
            "type": "object",
            "description": "Every error: a short title and a sentence that says what to fix.",
            "required": ["title", "description"],
            "properties": {"title": {"type": "string"}, "description": {"type": "string"}},
            "additionalProperties": False,
        },
        "PromptRequest": {
            "type": "object",
            "required": ["text"],
            "additionalProperties": False,
            "properties": {
                "text": {
                    "type": "string", "minLength": 1, "maxLength": settings.max_prompt_chars,
                    "pattern": non_blank,
                    "description": "The prompt (SA_MAX_PROMPT_CHARS characters at most; not "
                                   "blank; no NUL character, no lone surrogate).",
                },
                "parent_id": {
                    "anyOf": [{"type": "string", "format": "uuid", "pattern": UUID_PATTERN},
                              {"type": "null"}],
                    "description": "A prompt or response of the caller's org that this prompt "
                                   "continues; its ancestors become the conversation context. "
                                   "An id naming no entity of the org answers 422.",
                },
                "priority": {"type": "integer", "minimum": 0, "maximum": 100, "default": 50,
                             "description": "Lower runs first."},
                "max_attempts": {"type": "integer", "minimum": 1, "maximum": MAX_ATTEMPTS_LIMIT,
                                 "default": 3, "description": "Attempts allowed, retries included."},
                "options": _ref("ExecutionOptions"),
            },
        },
        "ExecutionOptions": {
            "type": "object",
            "additionalProperties": False,
            "description": "Execution options; only these keys are accepted.",
            "properties": {
                "model": {"type": "string", "minLength": 1, "maxLength": MAX_MODEL_CHARS,
                          "pattern": non_blank,
                          "description": "Provider model (default SA_PROVIDER_MODEL)."},
                "depth": {"type": "integer", "minimum": 0, "maximum": MAX_DEPTH, "default": 10,
                          "description": "Ancestors sent to the provider as context."},
            },
        },
        "Submitted": {
            "type": "object",
            "required": ["prompt_id", "job_id", "state"],
            "additionalProperties": False,
            "properties": {"prompt_id": _UUID, "job_id": _UUID,
                           "state": {"type": "string", "const": "queued"}},
        },
        "Retried": {
            "type": "object",
            "required": ["prompt_id", "job_id", "state", "supersedes"],
            "additionalProperties": False,
            "properties": {"prompt_id": _UUID, "job_id": _UUID,
                           "state": {"type": "string", "const": "queued"}, "supersedes": _UUID},
        },
        "Job": {
            "type": "object",
            "description": "One execution attempt series of a prompt (every column of sa_job).",
            "required": ["id", "prompt_id", "state", "priority", "attempt", "max_attempts",
                         "execution_options", "org_id", "created_by", "scheduled_for",
                         "created_at", "updated_at"],
            "properties": {
                "id": _UUID, "prompt_id": _UUID,
                "state": {"type": "string", "enum": JOB_STATES},
                "priority": {"type": "integer", "minimum": 0, "maximum": 100},
                "attempt": {"type": "integer", "minimum": 1},
                "max_attempts": {"type": "integer", "minimum": 1},
                "execution_options": {"type": "object"},
                "worker_claim": _nullable({"type": "string"}),
                "claimed_at": _nullable(_TIME), "started_at": _nullable(_TIME),
                "running_heartbeat_at": _nullable(_TIME), "finished_at": _nullable(_TIME),
                "response_id": _nullable(_UUID),
                "error_kind": _nullable({"type": "string", "enum": ERROR_KINDS}),
                "error_message": _nullable({"type": "string"}),
                "supersedes": _nullable(_UUID),
                "org_id": {"type": "integer"}, "created_by": {"type": "integer"},
                "scheduled_for": _TIME, "created_at": _TIME, "updated_at": _TIME,
            },
        },
        "Entity": {
            "type": "object",
            "description": "A prompt or a response.",
            "required": ["id", "kind", "content", "correlation_id", "created_by", "created_at"],
            "properties": {
                "id": _UUID, "kind": {"type": "string", "enum": ["prompt", "response"]},
                "parent_id": _nullable(_UUID), "correlation_id": _UUID,
                "causation_id": _nullable(_UUID), "content": {"type": "string"},
                "source_refs": {}, "truth_class": _nullable({"type": "string"}),
                "state_class": _nullable({"type": "string"}),
                "created_by": {"type": "integer"}, "created_at": _TIME, "updated_at": _TIME,
            },
        },
        "PromptView": {
            "type": "object",
            "required": ["prompt", "response", "jobs"],
            "properties": {
                "prompt": _ref("Entity"),
                "response": _nullable(_ref("Entity")),
                "jobs": {"type": "array", "items": _ref("Job"),
                         "description": "Every job of the prompt, newest first."},
            },
        },
        "MissionItem": {
            "type": "object",
            "description": "A prompt whose jobs changed, with its latest job.",
            "required": ["prompt_id", "text", "job_id", "state", "updated_at"],
            "properties": {
                "prompt_id": _UUID, "parent_id": _nullable(_UUID), "text": {"type": "string"},
                "created_at": _TIME, "job_id": _UUID,
                "state": {"type": "string", "enum": JOB_STATES},
                "attempt": {"type": "integer"}, "max_attempts": {"type": "integer"},
                "priority": {"type": "integer"},
                "error_kind": _nullable({"type": "string", "enum": ERROR_KINDS}),
                "error_message": _nullable({"type": "string"}),
                "response_id": _nullable(_UUID), "updated_at": _TIME,
                "response_text": _nullable({"type": "string"}),
            },
        },
        "MissionRecent": {
            "type": "object",
            "required": ["as_of", "items", "next_cursor", "has_more"],
            "additionalProperties": False,
            "properties": {
                "as_of": {**_TIME, "description": "When the page was read. Continue with "
                                                  "`next_cursor`; `since` only starts a feed."},
                "items": {"type": "array", "items": _ref("MissionItem"),
                          "description": "Each prompt with an event in the page, once, with "
                                         "its latest job, in the order of its last event."},
                "next_cursor": {"type": "string", "pattern": CURSOR_PATTERN,
                                "description": "Pass it back as `cursor`: the next page starts "
                                               "exactly where this one ended."},
                "has_more": {"type": "boolean",
                             "description": "The page was full: ask again at once for the rest."},
            },
        },
        "Health": {
            "type": "object", "required": ["ok"],
            "properties": {"ok": {"type": "boolean"}, "database": {"type": "string"}},
        },
    }


def _paths() -> dict[str, Any]:
    api = API_PREFIX
    replayed = {
        "Idempotent-Replayed": {
            "description": "`true` when the answer replays an earlier submit with the same "
                           "Idempotency-Key (nothing new was queued).",
            "required": False, "schema": {"type": "string", "enum": ["true"]}},
    }
    return {
        "/healthz": {"get": {
            "operationId": "health", "summary": "Liveness: the process answers.",
            "security": [], "responses": {"200": _json("Alive.", _ref("Health"))}}},
        "/readyz": {"get": {
            "operationId": "ready", "summary": "Readiness: the database answers.",
            "security": [], "responses": {"200": _json("Ready.", _ref("Health")),
                                          **_errors("503")}}},
        "/metrics": {"get": {
            "operationId": "metrics", "summary": "Prometheus metrics (text exposition format).",
            "security": [], "responses": {"200": {
                "description": "The metrics page.",
                "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
        OPENAPI_PATH: {"get": {
            "operationId": "openapi", "summary": "This document.", "security": [],
            "responses": {"200": _json("The OpenAPI document.", {"type": "object"})}}},
        f"{api}/prompt": {"post": {
            "operationId": "submitPrompt",
            "summary": "Submit a prompt: 202 at once, a worker runs it.",
            "description": (
                "Writes the prompt and a queued job atomically. With an `Idempotency-Key`, a "
                f"repeat of the same request by the same user within {KEY_TTL_SECONDS // 3600} h "
                "answers the original ids (with `Idempotent-Replayed: true`) and queues nothing, "
                "even when the repeats race; the same key with a different request answers 422. "
                "When the caller's org already has SA_ORG_MAX_QUEUED jobs queued, it answers 429 "
                "and writes nothing."),
            "parameters": [{
                "name": "Idempotency-Key", "in": "header", "required": False,
                "description": f"1 to {MAX_KEY_LENGTH} visible ASCII characters; scoped to the "
                               "caller's org and user.",
                "schema": {"type": "string", "minLength": 1, "maxLength": MAX_KEY_LENGTH,
                           "pattern": "^[!-~]+$"}}],
            "requestBody": {"required": True, "content": {
                "application/json": {"schema": _ref("PromptRequest")}}},
            "responses": {
                "202": _json("Queued (or replayed).", _ref("Submitted"),
                             {**_LOCATION, **replayed}),
                **_errors("400", "401", "413", "415", "422"),
                "429": _error("The org's queue is full (SA_ORG_MAX_QUEUED); nothing was written.", {
                    "Retry-After": {"description": f"Seconds to wait ({QUEUE_FULL_RETRY_AFTER}).",
                                    "required": True, "schema": {"type": "string"}}}),
                **_errors("503"),
            }}},
        f"{api}/jobs/{{job_id}}": {"get": {
            "operationId": "getJob", "summary": "One job.",
            "parameters": [_path_id("job_id", "job")],
            "responses": {"200": _json("The job.", _ref("Job")),
                          **_errors("400", "401", "404", "503")}}},
        f"{api}/jobs/{{job_id}}/cancel": {"post": {
            "operationId": "cancelJob", "summary": "Cancel a queued or running job.",
            "parameters": [_path_id("job_id", "job")],
            "requestBody": _NO_BODY,
            "responses": {"200": _json("The cancelled job.", _ref("Job")),
                          **_errors("400", "401", "404", "409", "413", "415", "422", "503")}}},
        f"{api}/prompts/{{prompt_id}}": {"get": {
            "operationId": "getPrompt", "summary": "A prompt, its response (if any), its jobs.",
            "parameters": [_path_id("prompt_id", "prompt")],
            "responses": {"200": _json("The prompt.", _ref("PromptView")),
                          **_errors("400", "401", "404", "503")}}},
        f"{api}/prompts/{{prompt_id}}/retry": {"post": {
            "operationId": "retryPrompt",
            "summary": "Queue a new job superseding the prompt's latest (finished) job.",
            "parameters": [_path_id("prompt_id", "prompt")],
            "requestBody": _NO_BODY,
            "responses": {"202": _json("The new job.", _ref("Retried"), _LOCATION),
                          **_errors("400", "401", "404", "409", "413", "415", "422", "503")}}},
        f"{api}/mission/recent": {"get": {
            "operationId": "missionRecent",
            "summary": "The viewer's prompts whose jobs changed, a page at a time.",
            "description": (
                "Pages the same event log as /mission/events: a page is the viewer's next "
                "`limit` transitions (heartbeats are none), collapsed to their prompts' latest "
                "state. Following `next_cursor` misses nothing, even a transaction that commits "
                "late, and repeats a prompt only when it changed again."),
            "parameters": [
                {"name": "cursor", "in": "query", "required": False,
                 "description": "The previous answer's `next_cursor` (opaque). Wins over `since`.",
                 "schema": {"type": "string", "pattern": CURSOR_PATTERN}},
                {"name": "since", "in": "query", "required": False,
                 "description": "A first call's start: ISO 8601 date or date-time (no offset "
                                "means UTC). Without it and without `cursor`, the feed starts "
                                "at the beginning of the log.",
                 "schema": {"type": "string", "pattern": SINCE_PATTERN}},
                {"name": "limit", "in": "query", "required": False,
                 "description": "Most transitions read, hence most items answered.",
                 "schema": {"type": "integer", "minimum": 1, "maximum": RECENT_LIMIT_MAX,
                            "default": RECENT_LIMIT_DEFAULT}},
                _SCOPE],
            "responses": {"200": _json("A page of changes.", _ref("MissionRecent")),
                          **_errors("400", "401", "503")}}},
        f"{api}/mission/events": {"get": {
            "operationId": "missionEvents",
            "summary": "Server-Sent Events of the caller's own jobs' transitions.",
            "description": (
                "`event: job.state_changed`, `id:` the event id, `data:` JSON. Resumes after "
                "`Last-Event-ID`; a replay sends at most SA_SSE_REPLAY_LIMIT events, then the "
                "stream ends and the EventSource reconnects (after `retry:`) with the last id it "
                "got, for the next part. The stream ends when its token is revoked or expires "
                "(within SA_SSE_TOKEN_CHECK seconds) and at shutdown; otherwise never."),
            "parameters": [
                {"name": "Last-Event-ID", "in": "header", "required": False,
                 "description": f"The last event id received (0 to {MAX_EVENT_ID}).",
                 "schema": {"type": "string", "pattern": EVENT_ID_PATTERN}},
                {"name": "last_event_id", "in": "query", "required": False,
                 "description": "As Last-Event-ID, for clients that cannot send it; the header "
                                "wins.",
                 "schema": {"type": "integer", "minimum": 0, "maximum": MAX_EVENT_ID}},
                _SCOPE,
                {"name": "access_token", "in": "query", "required": False,
                 "description": "The token, for EventSource clients that cannot send headers.",
                 "schema": {"type": "string"}}],
            "responses": {"200": {"description": "The event stream.",
                                  "content": {"text/event-stream": {"schema": {"type": "string"}}}},
                          **_errors("400", "401"),
                          "429": _error(
                              "The token already has SA_SSE_MAX_STREAMS_PER_TOKEN streams open "
                              "on this process, or the process SA_SSE_MAX_STREAMS.", {
                                  "Retry-After": {"description": "Seconds to wait.",
                                                  "required": True,
                                                  "schema": {"type": "string"}}}),
                          **_errors("503")}}},
    }


def build_openapi(settings: Settings) -> dict[str, Any]:
    """Returns the document for the app built with `settings` (limits come from there)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "sa-core",
            "version": "1",
            "description": (
                "Asynchronous prompt execution. Every route under /sa-core/v1 (but this document) "
                "needs `Authorization: Bearer <token>`. Errors are JSON `{title, description}`. "
                "Another org's objects answer 404, exactly like missing ones; members of one org "
                "share its prompts and jobs (see the README's Tenancy section). Request bodies "
                "must be `application/json`, at most SA_MAX_BODY_BYTES."),
        },
        "servers": [{"url": "/"}],
        "security": [{"bearerAuth": []}],
        "paths": _paths(),
        "components": {
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
            "schemas": _schemas(settings),
        },
    }


class OpenApiDocument:
    """Serves the document (no token needed)."""

    def __init__(self, document: dict[str, Any]) -> None:
        self._document = document

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Answers the document."""
        resp.media = self._document
