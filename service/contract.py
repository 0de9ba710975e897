"""The request contract: what each body field, query parameter and header of the API may hold,
declared once with the schema kit (`service/schema.py`).

The routes enforce these declarations (bodies here, headers and query parameters through
`service/parsers.py`) and the OpenAPI document publishes them (`service/openapi/`), so the two
cannot disagree.
"""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import falcon

from jobqueue.core.fallback import named_serving, serves
from jobqueue.core.routes import Routes
from jobqueue.engine.claim import DEFAULT_DEPTH, MAX_DEPTH
from jobqueue.engine.idempotency import MAX_KEY_LENGTH
from service.auth import QUERY_TOKEN_PARAM
from service.schema import (
    SINCE_PATTERN,
    Choice,
    Fields,
    Instant,
    Integer,
    Items,
    Number,
    OneOrMore,
    Param,
    Spec,
    Text,
    Uuid,
)

__all__ = [
    "ACCESS_TOKEN",
    "BATCH_DEFAULT_PRIORITY",
    "CURSOR",
    "CURSOR_PATTERN",
    "EVENT_ID_PATTERN",
    "IDEMPOTENCY_KEY",
    "JOBS_CURSOR",
    "JOBS_CURSOR_PATTERN",
    "JOBS_LIMIT",
    "JOBS_LIMIT_DEFAULT",
    "JOBS_LIMIT_MAX",
    "KEY_PATTERN",
    "LAST_EVENT_ID",
    "LAST_EVENT_ID_HEADER",
    "MAX_ATTEMPTS_LIMIT",
    "MAX_BATCH",
    "MAX_DEPTH",
    "MAX_EVENT_ID",
    "MAX_KEY_LENGTH",
    "MAX_MODEL_CHARS",
    "MAX_SCHEDULE_SECONDS",
    "MAX_WAIT_SECONDS",
    "NO_BODY",
    "PREFER",
    "PREFER_PATTERN",
    "RECENT_LIMIT",
    "RECENT_LIMIT_DEFAULT",
    "RECENT_LIMIT_MAX",
    "SCOPE",
    "SCOPES",
    "SINCE",
    "SNAPSHOT_BEFORE",
    "SNAPSHOT_LIMIT",
    "PromptRequest",
    "check_routable",
    "options_body",
    "parse_batch",
    "parse_prompt",
    "prompt_batch_body",
    "prompt_body",
    "read_no_body",
]

MAX_ATTEMPTS_LIMIT = 10
MAX_MODEL_CHARS = 200
RECENT_LIMIT_DEFAULT = 100
RECENT_LIMIT_MAX = 500
SNAPSHOT_LIMIT_DEFAULT = 50
SNAPSHOT_LIMIT_MAX = 200
JOBS_LIMIT_DEFAULT = 20
JOBS_LIMIT_MAX = 100

MAX_WAIT_SECONDS = 60
"""The longest `Prefer: wait=N` a POST /prompt may hold its request open for."""

MAX_SCHEDULE_SECONDS = 366 * 86400
"""The furthest ahead a prompt may be scheduled (`run_at`, `delay_seconds`): a year and a day."""

MAX_EVENT_ID = 2**63 - 1
"""The largest event id (sa_job_event.id is a bigint)."""

EVENT_ID_PATTERN = "^[0-9]{1,19}$"
"""What Last-Event-ID may look like: a decimal event id (at most MAX_EVENT_ID)."""

CURSOR_PATTERN = "^[A-Za-z0-9_-]{11}$"
"""A /mission/recent cursor: opaque to clients (it is an event id, base64url of 8 bytes)."""

JOBS_CURSOR_PATTERN = "^[A-Za-z0-9_-]{32}$"
"""A cursor into a prompt's jobs: opaque to clients (the last job's creation time in
microseconds and its id, base64url of 24 bytes)."""

SCOPES = ("user", "org")
"""`scope` of the mission feeds: the viewer's own prompts (default) or the viewer's whole org."""

# NOTE: visible ASCII only, so a key is the same bytes in every client, log-safe and header-safe.
# Every pattern is used with fullmatch: a bare `$` would also match before a trailing newline.
KEY_PATTERN = "^[!-~]+$"
PREFER_PATTERN = "^[ \t]*wait=([0-9]|[1-5][0-9]|60)[ \t]*$"


MAX_STOP_CHARS = 200
MAX_STOPS = 4
MAX_OUTPUT_TOKENS = 1_000_000
MAX_SEED = 2**63 - 1

@functools.lru_cache(maxsize=8)
def options_body(max_chars: int) -> Fields:
    """Returns the `options` of POST /prompt: what the worker can use (claim.options_error reads
    the same); a system prompt may be as long as a prompt (SA_MAX_PROMPT_CHARS)."""
    fields: dict[str, Spec] = {
        "model": Text(MAX_MODEL_CHARS, "Provider model (default SA_PROVIDER_MODEL); it picks the "
                                       "model route, and a model no route serves answers 422."),
        "depth": Integer(0, MAX_DEPTH, DEFAULT_DEPTH, "Ancestors sent to the provider as context."),
        "system": Text(max_chars, "A system prompt, sent first, before the ancestors."),
        "temperature": Number(0, 2, "Sampling temperature, sent as is."),
        "top_p": Number(0, 1, "Nucleus sampling mass, sent as is."),
        "max_tokens": Integer(1, MAX_OUTPUT_TOKENS, description="Most tokens the reply may hold."),
        "stop": OneOrMore(Text(MAX_STOP_CHARS, blank=True), MAX_STOPS,
                          "Where the provider stops: one string or up to four (stored as a list); "
                          "blanks alone (\"\\n\\n\") are a stop sequence too, as in OpenAI's API."),
        "response_format": Fields(
            {"type": Choice(("text", "json_object"), "`json_object` asks for JSON mode.")},
            required=("type",), description="OpenAI's response_format: text or JSON mode."),
        "seed": Integer(-MAX_SEED - 1, MAX_SEED, description="Sampling seed, for providers that "
                                                             "honour one."),
        "prefer_provider": Text(MAX_MODEL_CHARS, "The name of a model route (SA_PROVIDER_ROUTES) "
                                                 "serving the model, called instead of the "
                                                 "model's first route; its fallbacks still "
                                                 "apply. A name that is no such route answers "
                                                 "422.")}
    return Fields(fields, description="Execution options; only these keys are accepted.",
                  unknown=f"unknown option (allowed: {', '.join(fields)})",
                  component="ExecutionOptions")


@dataclass(frozen=True)
class PromptRequest:
    """A validated POST /prompt body."""

    text: str
    parent_id: uuid.UUID | None
    priority: int
    max_attempts: int
    options: dict[str, Any]
    run_at: datetime | None = None
    delay_seconds: int | None = None
    after: uuid.UUID | None = None


DEFAULT_PRIORITY = 50
BATCH_DEFAULT_PRIORITY = 80
"""A batch is background work: unless an item says otherwise it runs after interactive prompts."""
MAX_BATCH = 1000
DEFAULT_MAX_ATTEMPTS = 3
PRIORITY = Integer(0, 100, DEFAULT_PRIORITY, "Lower runs first.")
BATCH_PRIORITY = Integer(0, 100, BATCH_DEFAULT_PRIORITY,
                         "Lower runs first; a batch item defaults to background priority.")
MAX_ATTEMPTS = Integer(1, MAX_ATTEMPTS_LIMIT, DEFAULT_MAX_ATTEMPTS,
                       "Attempts allowed, retries included.")


@functools.lru_cache(maxsize=8)
def prompt_body(max_chars: int, batch: bool = False) -> Fields:
    """Returns the POST /prompt body's declaration; the text's limit is SA_MAX_PROMPT_CHARS.

    With `batch`, the declaration of one item of POST /prompts/batch: the same fields, with the
    background default priority.

    PERF: built once per limit; building it per request tripled the cost of a parse.
    """
    # NOTE: fields are checked in this order, so a body with two bad fields names the first.
    return Fields({
        "parent_id": Uuid("A prompt or response of the caller's org that this prompt continues; "
                          "its ancestors become the conversation context. An id naming no "
                          "entity of the org answers 422."),
        "text": Text(max_chars, "The prompt (SA_MAX_PROMPT_CHARS characters at most; not blank; "
                                "no NUL character, no lone surrogate)."),
        "priority": BATCH_PRIORITY if batch else PRIORITY,
        "max_attempts": MAX_ATTEMPTS,
        "options": options_body(max_chars),
        "run_at": Instant(MAX_SCHEDULE_SECONDS, "Run no earlier than this ISO 8601 date-time (no "
                                                "offset means UTC; not past, at most a year and a "
                                                "day ahead). The job waits queued, cancellable."),
        "delay_seconds": Integer(0, MAX_SCHEDULE_SECONDS, None,
                                 "Run no earlier than this many seconds from now (not with "
                                 "run_at)."),
        **({} if batch else {"after": Uuid(
            "A job, or a prompt (its latest job), of the caller's org: this prompt runs only "
            "once that job succeeds, and continues its thread (the response becomes the parent "
            "unless parent_id is given). If it fails, is cancelled or superseded, this job "
            "ends cancelled with error_kind dependency_failed. One already failed answers 422. "
            "Not with run_at or delay_seconds.")}),
    }, required=("text",), component="BatchPromptRequest" if batch else "PromptRequest",
       exclusive=(("run_at", "delay_seconds"), ("run_at", "after"), ("delay_seconds", "after")))


@functools.lru_cache(maxsize=8)
def prompt_batch_body(max_chars: int) -> Fields:
    """Returns the POST /prompts/batch body's declaration."""
    return Fields({"prompts": Items(prompt_body(max_chars, batch=True), MAX_BATCH,
                                    f"1 to {MAX_BATCH} prompts, written all or none.")},
                  required=("prompts",), component="BatchRequest")


def _prompt_request(checked: dict[str, Any], default_priority: int) -> PromptRequest:
    return PromptRequest(text=checked["text"], parent_id=checked.get("parent_id"),
                         priority=checked.get("priority", default_priority),
                         max_attempts=checked.get("max_attempts", DEFAULT_MAX_ATTEMPTS),
                         options=checked.get("options", {}), run_at=checked.get("run_at"),
                         delay_seconds=checked.get("delay_seconds"), after=checked.get("after"))


def parse_prompt(body: object, max_chars: int) -> PromptRequest:
    """Validates a POST /prompt body.

    Raises:
        falcon.HTTPUnprocessableEntity: a field is missing, unknown or out of range.
    """
    return _prompt_request(prompt_body(max_chars).check(body, ""), DEFAULT_PRIORITY)


def parse_batch(body: object, max_chars: int) -> list[PromptRequest]:
    """Validates a POST /prompts/batch body: every item, each bad one named by its index.

    Raises:
        falcon.HTTPUnprocessableEntity: the body is malformed or any item is bad.
    """
    checked = prompt_batch_body(max_chars).check(body, "")
    return [_prompt_request(item, BATCH_DEFAULT_PRIORITY) for item in checked["prompts"]]


def check_routable(requests: list[PromptRequest], routes: Routes, batch: bool = False) -> None:
    """Refuses a model no route serves, so it is a 422 now rather than a failed job later.

    NOTE: a web process configured with no provider at all (only workers call one) judges
    nothing; the worker fails such a job as `invalid_options`.

    Args:
        requests: the prompt, or a batch's prompts.
        routes: the model routes.
        batch: name each bad item by its index (`prompts[3].options.model`), all in one 422.

    Raises:
        falcon.HTTPUnprocessableEntity: `options.model` (or the default model) has no route, or
            `options.prefer_provider` names no route serving it.
    """
    if not routes:
        return
    errors = []
    for index, request in enumerate(requests):
        model = request.options.get("model") or routes.default_model
        prefix = f"prompts[{index}].options" if batch else "options"
        if routes.for_model(model) is None:
            errors.append(f"{prefix}.model: no route serves model {model!r} (known: "
                          f"{', '.join(routes.known_models)})")
            continue
        prefer = request.options.get("prefer_provider")
        if prefer is not None and named_serving(routes, prefer, model) is None:
            serving = [r.name for r in routes.routes if serves(r, model)]
            errors.append(f"{prefix}.prefer_provider: no route {prefer!r} serves model {model!r} "
                          f"(known routes serving it: {', '.join(serving)})")
    if errors:
        raise falcon.HTTPUnprocessableEntity(title="Invalid field", description="; ".join(errors))


NO_BODY = Fields({}, description="No body is needed; an empty JSON object is accepted, anything "
                                 "else is a 422.", unknown="unknown field (this route takes no body)")
"""The body of a route that takes none: absent, or an empty JSON object."""


_NOT_SENT = object()
"""What `read_no_body` reads from an empty body, told apart from a JSON `null`."""


def read_no_body(req: falcon.Request) -> None:
    """Reads and validates the body of a route that takes none: absent, or an empty JSON object
    (a JSON `null` is a body like any other, refused).

    Raises:
        falcon.HTTPUnprocessableEntity: the body holds anything else.
    """
    body = req.get_media(default_when_empty=_NOT_SENT)
    if body is not _NOT_SENT:
        _check_no_body(body)


def _check_no_body(body: object) -> None:
    """Refuses any body but an empty JSON object."""
    if not isinstance(body, dict):
        raise falcon.HTTPUnprocessableEntity(
            title="Invalid body", description="This route takes no body (or an empty JSON object).")
    NO_BODY.check(body, "")



SINCE = Param("since", "query", {"type": "string", "pattern": SINCE_PATTERN},
              "A first call's start: ISO 8601 date or date-time (no offset means UTC). Without it "
              "and without `cursor`, the feed starts at the beginning of the log.", "2026-11-30T12:00:00Z")
CURSOR = Param("cursor", "query", {"type": "string", "pattern": CURSOR_PATTERN},
               "The previous answer's `next_cursor` (opaque). Wins over `since`.", "AAAAAAAAACo")
RECENT_LIMIT = Param("limit", "query", {"type": "integer", "minimum": 1,
                                        "maximum": RECENT_LIMIT_MAX,
                                        "default": RECENT_LIMIT_DEFAULT},
                     "Most transitions read, hence most items answered.", 50)
SNAPSHOT_BEFORE = Param("before", "query", {"type": "string", "pattern": CURSOR_PATTERN},
                        "The previous answer's `next_before` (opaque): the next, older prompts.",
                        "AAAAAAAAACo")
SNAPSHOT_LIMIT = Param("limit", "query", {"type": "integer", "minimum": 1,
                                          "maximum": SNAPSHOT_LIMIT_MAX,
                                          "default": SNAPSHOT_LIMIT_DEFAULT},
                       "Most prompts answered.", 50)
JOBS_CURSOR = Param("cursor", "query", {"type": "string", "pattern": JOBS_CURSOR_PATTERN},
                    "The previous answer's `next_cursor` (opaque): the next, older jobs.",
                    "AAZhfSYz0ABeb3qLnA1OH6KzxNXm96i5")
JOBS_LIMIT = Param("limit", "query", {"type": "integer", "minimum": 1, "maximum": JOBS_LIMIT_MAX,
                                      "default": JOBS_LIMIT_DEFAULT},
                   "Most jobs answered (newest first); fewer when their options pass "
                   "SA_PAGE_MAX_BYTES.", 20)
SCOPE = Param("scope", "query", {"type": "string", "enum": list(SCOPES), "default": SCOPES[0]},
              "`user`: the caller's own prompts (the default); `org`: every prompt of the "
              "caller's org (an explicit opt-in).", "user")
# NOTE: an empty (or blank) header reads as no header (service/parsers.py, parse_last_event_id).
LAST_EVENT_ID_HEADER = Param("Last-Event-ID", "header",
                             {"type": "string", "pattern": f"^({EVENT_ID_PATTERN[1:-1]})?$"},
                             f"The last event id received (0 to {MAX_EVENT_ID}); empty, as if not "
                             "sent.", "41")
LAST_EVENT_ID = Param("last_event_id", "query",
                      {"type": "integer", "minimum": 0, "maximum": MAX_EVENT_ID},
                      "As Last-Event-ID, for clients that cannot send it; the header wins (both "
                      "must be valid).", 41)
IDEMPOTENCY_KEY = Param("Idempotency-Key", "header",
                        {"type": "string", "minLength": 1, "maxLength": MAX_KEY_LENGTH,
                         "pattern": KEY_PATTERN},
                        f"1 to {MAX_KEY_LENGTH} visible ASCII characters; scoped to the caller's "
                        "org and user.", "7c0e5a0e-2f1b-4d8e-9a51-3b0c6f2d9e11")
PREFER = Param("Prefer", "header", {"type": "string", "pattern": PREFER_PATTERN},
               f"`wait=N` (N from 0 to {MAX_WAIT_SECONDS}, RFC 7240): hold the answer up to N "
               "seconds for the job to finish; finished in time answers 200 with the job and "
               "`response_text`, else the usual 202. No other preference is taken.", "wait=30")

ACCESS_TOKEN = Param(QUERY_TOKEN_PARAM, "query", {"type": "string"},
                     "The token, for EventSource clients that cannot send headers.",
                     "sa_example-token")
