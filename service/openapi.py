"""The OpenAPI 3.1 document of the HTTP API, served at /sa-core/v1/openapi.json.

The request side (bodies, query parameters, headers) is generated from the declarations in
`service.contract`, the ones the routes enforce; the state and error-kind enums come from
`jobqueue.core.states.JobState` and `jobqueue.core.policy.ErrorKind`. Only the answers are
written here. `tests/test_openapi.py` fails when a route of the app is missing here or a
documented one is not served, and runs Schemathesis (every phase, every check) against it.
"""

from __future__ import annotations

import json
from typing import Any

import falcon

from jobqueue.core.policy import ErrorKind
from jobqueue.core.settings import KEY_TTL_SECONDS, Settings
from jobqueue.core.states import JobState
from jobqueue.engine.enqueue import QUEUE_FULL_RETRY_AFTER
from service.auth import API_PREFIX
from service.contract import (
    CURSOR,
    CURSOR_PATTERN,
    EVENT_ID_PATTERN,
    IDEMPOTENCY_KEY,
    LAST_EVENT_ID,
    LAST_EVENT_ID_HEADER,
    MAX_BATCH,
    NO_BODY,
    OPTIONS,
    PREFER,
    RECENT_LIMIT,
    SCOPE,
    SINCE,
    prompt_batch_body,
    prompt_body,
)
from service.events.stream import DELTA_EVENT_NAME, EVENT_NAME
from service.schema import Param

__all__ = ["DELTA_SCHEMA", "EVENT_SCHEMA", "OPENAPI_PATH", "OpenApiDocument", "build_openapi"]

OPENAPI_PATH = f"{API_PREFIX}/openapi.json"

EVENT_SCHEMA = "JobStateChanged"
"""The component that each SSE `job.state_changed` event's `data:` conforms to."""

DELTA_SCHEMA = "OutputDelta"
"""The component that each SSE `job.output_delta` event's `data:` conforms to."""

Schema = dict[str, Any]

JOB_STATES = [state.value for state in JobState]
ERROR_KINDS = [kind.value for kind in ErrorKind]

_JOB_ID = "3f1c8d2e-5b7a-4c19-9e2f-0a6d4b8c7e51"
_PROMPT_ID = "9b2e4f6a-1c3d-4e5f-8a7b-6c5d4e3f2a10"
_RESPONSE_ID = "c4d5e6f7-a8b9-4c0d-8e1f-2a3b4c5d6e7f"
_OLD_JOB_ID = "5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9"
_AT = "2026-11-30T12:00:00.123456+00:00"

_JOB_EXAMPLE: Schema = {
    "id": _JOB_ID, "prompt_id": _PROMPT_ID, "state": "succeeded", "priority": 50, "attempt": 1,
    "max_attempts": 3, "execution_options": {"depth": 4}, "worker_claim": None,
    "claimed_at": "2026-11-30T12:00:00.010000+00:00",
    "started_at": "2026-11-30T12:00:00.010000+00:00",
    "running_heartbeat_at": "2026-11-30T12:00:00.010000+00:00", "finished_at": _AT,
    "response_id": _RESPONSE_ID, "error_kind": None, "error_message": None, "supersedes": None,
    "org_id": 1, "created_by": 7, "scheduled_for": "2026-11-30T12:00:00+00:00",
    "created_at": "2026-11-30T12:00:00+00:00", "updated_at": _AT,
    "usage": [{"attempt": 1, "tokens_in": 12, "tokens_out": 48}], "partial_text": None,
}
_PROMPT_EXAMPLE: Schema = {
    "id": _PROMPT_ID, "kind": "prompt", "parent_id": None, "correlation_id": _PROMPT_ID,
    "causation_id": None, "content": "Summarise the spec in one line.", "source_refs": [],
    "truth_class": None, "state_class": None, "created_by": 7,
    "created_at": "2026-11-30T12:00:00+00:00", "updated_at": "2026-11-30T12:00:00+00:00",
}
_EVENT_EXAMPLE: Schema = {
    "id": 42, "job_id": _JOB_ID, "prompt_id": _PROMPT_ID, "created_by": 7,
    "from_state": "running", "to_state": "succeeded", "attempt": 1, "error_kind": None,
    "response_id": _RESPONSE_ID, "at": _AT, "response_text": "The spec, in one line.",
}

_ERROR_EXAMPLES = {
    "400": ("Invalid parameter", "The \"since\" parameter is invalid. must be an ISO 8601 timestamp"),
    "401": ("Unauthorized", "A valid bearer token is required."),
    "404": ("Not found", f"job {_JOB_ID} not found"),
    "403": ("Forbidden", "This route needs a token with the ops scope."),
    "409": ("Conflict", f"job {_JOB_ID} is succeeded"),
    "413": ("Request body too large", "The body is larger than 1048576 bytes."),
    "415": ("Unsupported media type", "Send the body as application/json."),
    "422": ("Invalid field", "priority: must be between 0 and 100"),
    "429": ("Too many requests", "Try again later."),
    "503": ("Database unavailable", "OperationalError"),
}


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


_UUID: Schema = {"type": "string", "format": "uuid"}
_TIME: Schema = {"type": "string", "format": "date-time"}


def _error(code: str, description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    title, detail = _ERROR_EXAMPLES[code]
    answer: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": _ref("Error"),
                                         "example": {"title": title, "description": detail}}},
    }
    if headers:
        answer["headers"] = headers
    return answer


_ERRORS: dict[str, dict[str, Any]] = {
    "400": _error("400", "Malformed request: the body is not JSON (or is empty), a header or "
                         "query parameter is malformed."),
    "401": _error("401", "No token, or the token is unknown, revoked or expired.", {
        "WWW-Authenticate": {"schema": {"type": "string", "const": "Bearer"}, "required": True}}),
    "404": _error("404", "No such object in the caller's org. Another org's objects, and "
                         "malformed ids, answer exactly like missing ones."),
    "403": _error("403", "The token lacks the scope the route needs (`ops`), or a session cookie "
                         "came from another origin or without X-SA-Session on a write."),
    "409": _error("409", "The object's state forbids the action (terminal job, or a job still "
                         "active)."),
    "413": _error("413", "The body is larger than SA_MAX_BODY_BYTES (default 1 MiB)."),
    "415": _error("415", "A body was sent that is not `application/json` (UTF-8)."),
    "422": _error("422", "The body is JSON but not acceptable: a field is missing, unknown, of "
                         "the wrong type or out of range (the description names it)."),
    "503": _error("503", "The database is unreachable; retry shortly (after Retry-After seconds, "
                         "when sent).", {
                             "Retry-After": {"schema": {"type": "string"}, "required": False}}),
}


def _errors(*codes: str) -> dict[str, dict[str, Any]]:
    return {code: _ERRORS[code] for code in codes}


def _json(description: str, schema: Schema, example: Any,
          headers: dict[str, Any] | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": schema, "example": example}}}
    if headers:
        answer["headers"] = headers
    return answer


def _path_id(name: str, what: str, example: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "description": f"The {what}'s id.",
            "schema": _UUID, "example": example}


def _param(param: Param, example: Any) -> dict[str, Any]:
    return {**param.openapi(), "example": example}


def _links(**targets: tuple[str, str, str]) -> dict[str, Any]:
    """Links from an answer to the operations its ids reach: name -> (operationId, parameter,
    the answer's field). A `parent_id` parameter is a follow-up POST /prompt's body field."""
    links: dict[str, Any] = {}
    for name, (operation, parameter, field) in targets.items():
        value = f"$response.body#/{field}"
        links[name] = {"operationId": operation, **(
            {"requestBody": {"text": "Go on.", "parent_id": value}} if parameter == "parent_id"
            else {"parameters": {parameter: value}})}
    return links


_NO_BODY: dict[str, Any] = {
    "required": False,
    "description": NO_BODY.description,
    "content": {"application/json": {"schema": NO_BODY.schema(), "example": {}}},
}

_EVENT_FRAME: Schema = {
    "description": "Each event of the stream (Open API 3.1 reads a text/event-stream schema as "
                   "one event's). `retry:`, lone `id:` and `: keepalive` frames dispatch none. "
                   "A `job.output_delta` has no `id:`: it is not in the log and is not replayed.",
    "oneOf": [{
        "type": "object",
        "required": ["event", "id", "data"],
        "additionalProperties": False,
        "properties": {
            "event": {"type": "string", "const": EVENT_NAME},
            "id": {"type": "string", "pattern": EVENT_ID_PATTERN},
            "data": {"type": "string", "contentMediaType": "application/json",
                     "contentSchema": _ref(EVENT_SCHEMA)},
        },
    }, {
        "type": "object",
        "required": ["event", "data"],
        "additionalProperties": False,
        "properties": {
            "event": {"type": "string", "const": DELTA_EVENT_NAME},
            "data": {"type": "string", "contentMediaType": "application/json",
                     "contentSchema": _ref(DELTA_SCHEMA)},
        },
    }],
}

_LOCATION = {"Location": {"description": "The job's URL.", "required": True,
                          "schema": {"type": "string"}}}


def _schemas(settings: Settings) -> dict[str, Schema]:
    return {
        "Error": {
            "type": "object",
            "description": "Every error: a short title and a sentence that says what to fix.",
            "required": ["title", "description"],
            "properties": {"title": {"type": "string"}, "description": {"type": "string"}},
            "additionalProperties": False,
        },
        "PromptRequest": prompt_body(settings.max_prompt_chars).schema(),
        "BatchPromptRequest": prompt_body(settings.max_prompt_chars, batch=True).schema(),
        "BatchRequest": prompt_batch_body(settings.max_prompt_chars).schema(),
        "BatchSubmitted": {
            "type": "object",
            "required": ["items"],
            "additionalProperties": False,
            "properties": {"items": {"type": "array", "minItems": 1, "maxItems": MAX_BATCH,
                                     "items": _ref("Submitted"),
                                     "description": "One per prompt, in input order."}},
        },
        "ExecutionOptions": OPTIONS.schema(),
        "Submitted": {
            "type": "object",
            "required": ["prompt_id", "job_id", "state"],
            "additionalProperties": False,
            "properties": {"prompt_id": _UUID, "job_id": _UUID,
                           "state": {"type": "string", "const": JobState.QUEUED.value}},
        },
        "Session": {
            "type": "object",
            "description": "Whom the request acts for; `expires_at` when a session was opened.",
            "required": ["org_id", "user_id", "scopes"],
            "properties": {"org_id": {"type": "integer"}, "user_id": {"type": "integer"},
                           "scopes": {"type": "array", "items": {"type": "string",
                                                                 "enum": ["ops"]}},
                           "expires_at": _TIME},
        },
        "OpsOverview": {
            "type": "object",
            "description": "Every org's queue: `metrics` as `sa-core queue-metrics --json` over the "
                           "last hour, `running` and `failures` as `sa-core list-jobs --json`.",
            "required": ["as_of", "metrics", "running", "failures"],
            "properties": {"as_of": _TIME, "metrics": {"type": "object"},
                           "running": {"type": "array", "items": {"type": "object"}},
                           "failures": {"type": "array", "items": {"type": "object"}}},
        },
        "Retried": {
            "type": "object",
            "required": ["prompt_id", "job_id", "state", "supersedes"],
            "additionalProperties": False,
            "properties": {"prompt_id": _UUID, "job_id": _UUID,
                           "state": {"type": "string", "const": JobState.QUEUED.value},
                           "supersedes": _UUID},
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
                "partial_text": _nullable({
                    "type": "string", "description": "While a streamed attempt runs, the text "
                    "it has produced so far (rewritten every SA_STREAM_INTERVAL); null otherwise. "
                    "Never a response: only a succeeded attempt's text becomes one. On GET."}),
                "usage": {
                    "type": "array", "description": "Tokens of each attempt that called the "
                    "provider, oldest first (null where the provider reported none); on GET.",
                    "items": {"type": "object", "required": ["attempt", "tokens_in", "tokens_out"],
                              "additionalProperties": False,
                              "properties": {"attempt": {"type": "integer", "minimum": 1},
                                             "tokens_in": _nullable({"type": "integer"}),
                                             "tokens_out": _nullable({"type": "integer"})}}},
                "after_job_id": _nullable(_UUID),
            },
        },
        "JobWithResponse": {
            "allOf": [_ref("Job")],
            "type": "object",
            "description": "A finished job with its response's text (null unless it succeeded).",
            "required": ["response_text"],
            "properties": {"response_text": _nullable({"type": "string"})},
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
        EVENT_SCHEMA: {
            "type": "object",
            "description": "The `data:` of an SSE `job.state_changed` event: one transition of "
                           "a job (`from_state` null when the job was created).",
            "required": ["id", "job_id", "prompt_id", "created_by", "from_state", "to_state",
                         "attempt", "error_kind", "response_id", "at", "response_text"],
            "additionalProperties": False,
            "properties": {
                "id": {"type": "integer", "minimum": 1,
                       "description": "The event id, also the frame's `id:`."},
                "job_id": _UUID, "prompt_id": _UUID,
                "created_by": {"type": "integer",
                               "description": "The job's creator (tells an org-wide stream "
                                              "whose job moved)."},
                "from_state": _nullable({"type": "string", "enum": JOB_STATES}),
                "to_state": {"type": "string", "enum": JOB_STATES},
                "attempt": {"type": "integer", "minimum": 1},
                "error_kind": _nullable({"type": "string", "enum": ERROR_KINDS}),
                "response_id": _nullable(_UUID),
                "at": _TIME,
                "response_text": _nullable({
                    "type": "string", "description": "The answer, on the event to `succeeded` "
                                                     "(null on every other)."}),
            },
        },
        DELTA_SCHEMA: {
            "type": "object",
            "description": "The `data:` of an SSE `job.output_delta` event: text a streamed "
                           "attempt appended (coalesced every SA_STREAM_INTERVAL). `offset` 0 "
                           "starts an attempt: a retry's text starts over. Partial text never "
                           "becomes a response unless its attempt succeeds.",
            "required": ["job_id", "prompt_id", "attempt", "offset", "text"],
            "additionalProperties": False,
            "properties": {
                "job_id": _UUID, "prompt_id": _UUID,
                "attempt": {"type": "integer", "minimum": 1},
                "offset": {"type": "integer", "minimum": 0,
                           "description": "Characters of the attempt's text before `text`."},
                "text": {"type": "string"},
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
    job = _json("The job.", _ref("Job"), _JOB_EXAMPLE)
    job["links"] = _links(GetJob=("getJob", "job_id", "id"),
                          GetPrompt=("getPrompt", "prompt_id", "prompt_id"),
                          RetryPrompt=("retryPrompt", "prompt_id", "prompt_id"))
    queued = {"prompt_id": _PROMPT_ID, "job_id": _JOB_ID, "state": JobState.QUEUED.value}
    submitted = _json("Queued (or replayed).", _ref("Submitted"), queued, {**_LOCATION, **replayed})
    submitted["links"] = _links(GetJob=("getJob", "job_id", "job_id"),
                                CancelJob=("cancelJob", "job_id", "job_id"),
                                GetPrompt=("getPrompt", "prompt_id", "prompt_id"),
                                RetryPrompt=("retryPrompt", "prompt_id", "prompt_id"),
                                FollowUp=("submitPrompt", "parent_id", "prompt_id"))
    retried = _json("The new job.", _ref("Retried"), {**queued, "supersedes": _OLD_JOB_ID},
                    _LOCATION)
    retried["links"] = _links(GetJob=("getJob", "job_id", "job_id"),
                              CancelJob=("cancelJob", "job_id", "job_id"),
                              GetPrompt=("getPrompt", "prompt_id", "prompt_id"))
    view = _json("The prompt.", _ref("PromptView"),
                 {"prompt": _PROMPT_EXAMPLE,
                  "response": {**_PROMPT_EXAMPLE, "id": _RESPONSE_ID, "kind": "response",
                               "parent_id": _PROMPT_ID, "causation_id": _JOB_ID,
                               "content": "One queue, many workers, nothing lost."},
                  "jobs": [_JOB_EXAMPLE]})
    view["links"] = _links(RetryPrompt=("retryPrompt", "prompt_id", "prompt/id"),
                           FollowUp=("submitPrompt", "parent_id", "prompt/id"))
    recent = {"as_of": _AT, "next_cursor": "AAAAAAAAACo", "has_more": False, "items": [{
        "prompt_id": _PROMPT_ID, "parent_id": None, "text": _PROMPT_EXAMPLE["content"],
        "created_at": "2026-11-30T12:00:00+00:00", "job_id": _JOB_ID, "state": "succeeded",
        "attempt": 1, "max_attempts": 3, "priority": 50, "error_kind": None,
        "error_message": None, "response_id": _RESPONSE_ID, "updated_at": _AT,
        "response_text": "One queue, many workers, nothing lost."}]}
    too_many = {"Retry-After": {"description": "Seconds to wait.", "required": True,
                                "schema": {"type": "string"}}}
    return {
        "/healthz": {"get": {
            "operationId": "health", "summary": "Liveness: the process answers.",
            "security": [], "responses": {"200": _json("Alive.", _ref("Health"), {"ok": True})}}},
        "/readyz": {"get": {
            "operationId": "ready", "summary": "Readiness: the database answers.",
            "security": [], "responses": {
                "200": _json("Ready.", _ref("Health"), {"ok": True, "database": "up"}),
                **_errors("503")}}},
        "/metrics": {"get": {
            "operationId": "metrics", "summary": "Prometheus metrics (text exposition format).",
            "security": [], "responses": {"200": {
                "description": "The metrics page.",
                "content": {"text/plain": {
                    "schema": {"type": "string"},
                    "example": "# TYPE sa_jobs_enqueued_total counter\n"
                               "sa_jobs_enqueued_total 12.0\n"}}}}}},
        OPENAPI_PATH: {"get": {
            "operationId": "openapi", "summary": "This document.", "security": [],
            "responses": {"200": _json("The OpenAPI document.", {"type": "object"},
                                       {"openapi": "3.1.0", "info": {"title": "sa-core",
                                                                     "version": "1"}})}}},
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
            "parameters": [_param(IDEMPOTENCY_KEY, "7c0e5a0e-2f1b-4d8e-9a51-3b0c6f2d9e11"),
                           _param(PREFER, "wait=30")],
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": _ref("PromptRequest"),
                "example": {"text": "Summarise the spec in one line.", "priority": 20,
                            "max_attempts": 3, "options": {"depth": 4}}}}},
            "responses": {
                "200": _json("Finished within `Prefer: wait=N` seconds: the job (in a terminal "
                             "state) and its response's text.", _ref("JobWithResponse"),
                             {**_JOB_EXAMPLE, "response_text": "One queue, many workers."},
                             {**_LOCATION, **replayed}),
                "202": submitted,
                **_errors("400", "401", "413", "415", "422"),
                "429": _error("429", "The org's queue is full (SA_ORG_MAX_QUEUED); nothing was "
                                     "written.", {
                    "Retry-After": {"description": f"Seconds to wait ({QUEUE_FULL_RETRY_AFTER}).",
                                    "required": True, "schema": {"type": "string"}}}),
                **_errors("503"),
            }}},
        f"{api}/prompts/batch": {"post": {
            "operationId": "submitBatch",
            "summary": f"Submit 1 to {MAX_BATCH} prompts at once: all or none, 202 at once.",
            "description": (
                "Each item takes POST /prompt's fields; `priority` defaults to background (80). "
                "Every item is validated first: a 422 names each bad one by index "
                "(`prompts[3].text: ...`) and writes nothing. One `Idempotency-Key` covers the "
                "batch: a repeat answers the original ids with `Idempotent-Replayed: true`. "
                "The whole batch must fit under SA_ORG_MAX_QUEUED, else 429 and nothing written. "
                "The body counts against SA_MAX_BODY_BYTES (413)."),
            "parameters": [_param(IDEMPOTENCY_KEY, "0b6e2d7a-4c1f-4a8e-9d3b-7f5e1c2a9b40")],
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": _ref("BatchRequest"),
                "example": {"prompts": [{"text": "Summarise chapter 1."},
                                        {"text": "Summarise chapter 2.", "delay_seconds": 60}]}}}},
            "responses": {
                "202": _json("Queued (or replayed), in input order.", _ref("BatchSubmitted"),
                             {"items": [queued]}, replayed),
                **_errors("400", "401", "413", "415", "422"),
                "429": _error("429", "The batch would take the org past SA_ORG_MAX_QUEUED; "
                                     "nothing was written.", {
                    "Retry-After": {"description": f"Seconds to wait ({QUEUE_FULL_RETRY_AFTER}).",
                                    "required": True, "schema": {"type": "string"}}}),
                **_errors("503"),
            }}},
        f"{api}/jobs/{{job_id}}": {"get": {
            "operationId": "getJob", "summary": "One job.",
            "parameters": [_path_id("job_id", "job", _JOB_ID)],
            "responses": {"200": job, **_errors("400", "401", "404", "503")}}},
        f"{api}/jobs/{{job_id}}/cancel": {"post": {
            "operationId": "cancelJob", "summary": "Cancel a queued or running job.",
            "parameters": [_path_id("job_id", "job", _JOB_ID)],
            "requestBody": _NO_BODY,
            "responses": {"200": {**job, "description": "The cancelled job.",
                                  "content": {"application/json": {
                                      "schema": _ref("Job"),
                                      "example": {**{k: v for k, v in _JOB_EXAMPLE.items()
                                                     if k not in ("usage", "partial_text")},
                                                  "state": "cancelled",
                                                  "response_id": None,
                                                  "error_message": "cancelled by user 7"}}}},
                          **_errors("400", "401", "404", "409", "413", "415", "422", "503")}}},
        f"{api}/prompts/{{prompt_id}}": {"get": {
            "operationId": "getPrompt", "summary": "A prompt, its response (if any), its jobs.",
            "parameters": [_path_id("prompt_id", "prompt", _PROMPT_ID)],
            "responses": {"200": view, **_errors("400", "401", "404", "503")}}},
        f"{api}/prompts/{{prompt_id}}/retry": {"post": {
            "operationId": "retryPrompt",
            "summary": "Queue a new job superseding the prompt's latest (finished) job.",
            "parameters": [_path_id("prompt_id", "prompt", _PROMPT_ID)],
            "requestBody": _NO_BODY,
            "responses": {"202": retried,
                          **_errors("400", "401", "404", "409", "413", "415", "422", "503")}}},
        f"{api}/session": {
            "post": {
                "operationId": "openSession",
                "summary": "Open the mission page's session: 201 and an HttpOnly cookie.",
                "description": (
                    "Takes the token from the Authorization header (never a cookie) and sets "
                    "`sa_session` (HttpOnly, SameSite=Strict, Path=/sa-core/v1, at most 8 h and "
                    "never past the token's expiry). The cookie then authenticates same-origin "
                    "requests without a header; writes also need `X-SA-Session: 1`."),
                "requestBody": _NO_BODY,
                "responses": {"201": _json("The session is open.", _ref("Session"), {
                    "org_id": 1, "user_id": 7, "scopes": [], "expires_at": _AT}),
                    **_errors("400", "401", "403", "413", "415", "422", "503")}},
            "get": {
                "operationId": "getSession", "summary": "Whom the request acts for.",
                "responses": {"200": _json("The caller.", _ref("Session"),
                                           {"org_id": 1, "user_id": 7, "scopes": ["ops"]}),
                              **_errors("401", "403", "503")}},
            "delete": {
                "operationId": "closeSession",
                "summary": "End the cookie's session at once and drop the cookie.",
                "responses": {"204": {"description": "Signed out."},
                              **_errors("401", "403", "503")}}},
        f"{api}/ops/overview": {"get": {
            "operationId": "opsOverview",
            "summary": "Every org's queue depth, oldest queued, running jobs and recent failures.",
            "description": "Needs a token with the `ops` scope (`sa-core create-token --scope ops`).",
            "responses": {"200": _json("The overview.", _ref("OpsOverview"), {
                "as_of": _AT, "metrics": {}, "running": [], "failures": []}),
                **_errors("401", "403", "503")}}},
        f"{api}/ops/jobs/{{job_id}}/cancel": {"post": {
            "operationId": "opsCancelJob", "summary": "Cancel any org's queued or running job.",
            "description": "Needs the `ops` scope.",
            "parameters": [_path_id("job_id", "job", _JOB_ID)],
            "requestBody": _NO_BODY,
            "responses": {"200": _json("The cancelled job.", _ref("Job"), {
                **_JOB_EXAMPLE, "state": "cancelled", "response_id": None,
                "error_message": "cancelled by operator user 7 of org 1"}),
                **_errors("400", "401", "403", "404", "409", "413", "415", "422", "503")}}},
        f"{api}/ops/jobs/{{job_id}}/retry": {"post": {
            "operationId": "opsRetryJob",
            "summary": "Queue a new job superseding any org's finished job.",
            "description": "Needs the `ops` scope.",
            "parameters": [_path_id("job_id", "job", _JOB_ID)],
            "requestBody": _NO_BODY,
            "responses": {"202": _json("The new job.", _ref("Retried"),
                                       {**queued, "supersedes": _OLD_JOB_ID}),
                          **_errors("400", "401", "403", "404", "409", "413", "415", "422", "503")}}},
        f"{api}/mission/recent": {"get": {
            "operationId": "missionRecent",
            "summary": "The viewer's prompts whose jobs changed, a page at a time.",
            "description": (
                "Pages the same event log as /mission/events: a page is the viewer's next "
                "`limit` transitions (heartbeats are none), collapsed to their prompts' latest "
                "state. Following `next_cursor` misses nothing, even a transaction that commits "
                "late, and repeats a prompt only when it changed again."),
            "parameters": [_param(CURSOR, "AAAAAAAAACo"), _param(SINCE, "2026-11-30T12:00:00Z"),
                           _param(RECENT_LIMIT, 50), _param(SCOPE, "user")],
            "responses": {"200": {**_json("A page of changes.", _ref("MissionRecent"), recent),
                                  "links": _links(
                                      FollowUp=("submitPrompt", "parent_id", "items/0/prompt_id"),
                                      GetPrompt=("getPrompt", "prompt_id", "items/0/prompt_id"),
                                      GetJob=("getJob", "job_id", "items/0/job_id"))},
                          **_errors("400", "401", "503")}}},
        f"{api}/mission/events": {"get": {
            "operationId": "missionEvents",
            "summary": "Server-Sent Events of the caller's own jobs' transitions.",
            "description": (
                "`event: job.state_changed`, `id:` the event id, `data:` JSON (the "
                f"`{EVENT_SCHEMA}` schema). Resumes after `Last-Event-ID`; a replay sends at "
                "most SA_SSE_REPLAY_LIMIT events, then the stream ends and the EventSource "
                "reconnects (after `retry:`) with the last id it got, for the next part. The "
                "stream ends when its token is revoked or expires (within SA_SSE_TOKEN_CHECK "
                "seconds) and at shutdown; otherwise never."),
            "parameters": [_param(LAST_EVENT_ID_HEADER, "41"), _param(LAST_EVENT_ID, 41),
                           _param(SCOPE, "user"),
                           {"name": "access_token", "in": "query", "required": False,
                            "description": "The token, for EventSource clients that cannot "
                                           "send headers.",
                            "schema": {"type": "string"}, "example": "sa_example-token"}],
            "responses": {"200": {"description": "The event stream.",
                                  "content": {"text/event-stream": {
                                      "schema": _EVENT_FRAME,
                                      "example": "retry: 2000\n\nid: 42\nevent: job.state_changed"
                                                 "\ndata: " + json.dumps(_EVENT_EXAMPLE) + "\n\n"}}},
                          **_errors("400", "401"),
                          "429": _error(
                              "429", "The token already has SA_SSE_MAX_STREAMS_PER_TOKEN streams "
                                     "open on this process, or the process SA_SSE_MAX_STREAMS.",
                              too_many),
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
