"""The request contract: what each body field, query parameter and header may hold, declared
once, and the validators that enforce it before any SQL runs.

Each declaration both checks a value (raising the 4xx the route answers) and writes its JSON
Schema; `service.openapi` builds the document's request side from these declarations only, so
the document and the validators cannot disagree.
"""

from __future__ import annotations

import base64
import functools
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import falcon

from jobqueue.core.routes import Routes
from jobqueue.engine.claim import DEFAULT_DEPTH, MAX_DEPTH
from jobqueue.engine.idempotency import MAX_KEY_LENGTH

__all__ = [
    "BATCH_DEFAULT_PRIORITY",
    "BLANK_CHARACTERS",
    "CURSOR",
    "CURSOR_PATTERN",
    "EVENT_ID_PATTERN",
    "IDEMPOTENCY_KEY",
    "INSTANT_PATTERN",
    "LAST_EVENT_ID",
    "LAST_EVENT_ID_HEADER",
    "MAX_ATTEMPTS_LIMIT",
    "MAX_BATCH",
    "MAX_DEPTH",
    "MAX_EVENT_ID",
    "MAX_MODEL_CHARS",
    "MAX_SCHEDULE_SECONDS",
    "MAX_WAIT_SECONDS",
    "NO_BODY",
    "OPTIONS",
    "OPTION_KEYS",
    "PREFER",
    "RECENT_LIMIT",
    "RECENT_LIMIT_DEFAULT",
    "RECENT_LIMIT_MAX",
    "SCOPE",
    "SCOPES",
    "SINCE",
    "SINCE_PATTERN",
    "TEXT_PATTERN",
    "UUID_PATTERN",
    "Choice",
    "Fields",
    "Instant",
    "Integer",
    "Items",
    "Number",
    "OneOrMore",
    "Param",
    "PromptRequest",
    "Spec",
    "Text",
    "Uuid",
    "check_routable",
    "encode_cursor",
    "parse_batch",
    "parse_cursor",
    "parse_event_id",
    "parse_idempotency_key",
    "parse_last_event_id",
    "parse_limit",
    "parse_no_body",
    "parse_org_wide",
    "parse_prefer_wait",
    "parse_prompt",
    "parse_since",
    "prompt_batch_body",
    "prompt_body",
]

Schema = dict[str, Any]

MAX_ATTEMPTS_LIMIT = 10
MAX_MODEL_CHARS = 200
RECENT_LIMIT_DEFAULT = 100
RECENT_LIMIT_MAX = 500

MAX_WAIT_SECONDS = 60
"""The longest `Prefer: wait=N` a POST /prompt may hold its request open for."""

MAX_SCHEDULE_SECONDS = 366 * 86400
"""The furthest ahead a prompt may be scheduled (`run_at`, `delay_seconds`): a year and a day."""

MAX_EVENT_ID = 2**63 - 1
"""The largest event id (sa_job_event.id is a bigint)."""

UUID_PATTERN = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
"""The only spelling of a UUID accepted in a body (`uuid.UUID` alone also takes braces, URNs...)."""

BLANK_CHARACTERS = (r"\t\n\u000b\f\r\u001c-\u001f \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029"
                    r"\u202f\u205f\u3000")
"""A character class of exactly the characters `str.isspace()` calls blank, spelled with escapes
that Python's `re` and the ECMA-262 regexes of JSON Schema read alike (their `\\s` differ)."""

TEXT_PATTERN = f"^[{BLANK_CHARACTERS}]*[^\\u0000{BLANK_CHARACTERS}][^\\u0000]*$"
"""A text field: not blank, no NUL character. Linear to match, even on a long blank string."""

_YEAR = "(000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})"
# NOTE: a century is a leap year when divisible by 400; year 0000 does not exist (Python refuses it).
_LEAP_YEAR = "([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)"
_MONTH_DAY = ("((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
              "|02-(0[1-9]|1[0-9]|2[0-8]))")
SINCE_PATTERN = (
    f"^({_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
    r"([T ]([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9]([.][0-9]{1,6})?)?(Z|[+-][01][0-9]:[0-5][0-9])?)?$"
)
"""What `since` may look like: a real ISO 8601 date or date-time, offset optional (none means UTC).

NOTE: the calendar (month lengths, leap years, no year 0) is in the pattern itself, so every
string the document allows names an instant and is answered 200, never 400.
"""

INSTANT_PATTERN = (
    f"^({_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
    r"[T ]([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9]([.][0-9]{1,6})?)?(Z|[+-][01][0-9]:[0-5][0-9])?$"
)
"""An instant in a body (`run_at`): an ISO 8601 date-time, as SINCE_PATTERN but with the time
required (a bare date is ambiguous for a schedule); no offset means UTC."""

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
_INSTANT_RE = re.compile(INSTANT_PATTERN)
# NOTE: visible ASCII only, so a key is the same bytes in every client, log-safe and header-safe.
# Every pattern is used with fullmatch: a bare `$` would also match before a trailing newline.
_KEY_PATTERN = "^[!-~]+$"
_KEY_RE = re.compile(_KEY_PATTERN)
_PREFER_PATTERN = "^[ \t]*wait=([0-9]|[1-5][0-9]|60)[ \t]*$"
_PREFER_RE = re.compile(_PREFER_PATTERN)


def _invalid(name: str, why: str) -> falcon.HTTPUnprocessableEntity:
    return falcon.HTTPUnprocessableEntity(title="Invalid field", description=f"{name}: {why}")


def _described(schema: Schema, description: str) -> Schema:
    return {**schema, "description": description} if description else schema


@dataclass(frozen=True)
class Integer:
    """A JSON integer within [low, high]; a float with no fraction (5.0, 1e2) is one too, as in
    JSON Schema."""

    low: int
    high: int
    default: int | None = None
    description: str = ""

    def schema(self) -> Schema:
        """Returns the JSON Schema of the field."""
        schema: Schema = {"type": "integer", "minimum": self.low, "maximum": self.high}
        if self.default is not None:
            schema["default"] = self.default
        return _described(schema, self.description)

    def check(self, value: object, name: str) -> int:
        """Returns the value as an int; raises a 422 naming `name` otherwise."""
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        # NOTE: bool is an int subclass; `true` is not a priority.
        if isinstance(value, bool) or not isinstance(value, int):
            raise _invalid(name, "must be an integer")
        if not self.low <= value <= self.high:
            raise _invalid(name, f"must be between {self.low} and {self.high}")
        return value


@dataclass(frozen=True)
class Text:
    """A non-blank string of at most `max_chars` characters, with no NUL (Postgres text cannot
    hold one) and no lone surrogate (JSON may spell one, UTF-8 cannot)."""

    max_chars: int
    description: str = ""

    def schema(self) -> Schema:
        """Returns the JSON Schema of the field (lone surrogates are in the description only:
        JSON Schema cannot name them)."""
        return _described({"type": "string", "minLength": 1, "maxLength": self.max_chars,
                           "pattern": TEXT_PATTERN}, self.description)

    def check(self, value: object, name: str) -> str:
        """Returns the value; raises a 422 naming `name` and the rule it breaks otherwise."""
        if not isinstance(value, str):
            raise _invalid(name, "must be a string")
        # NOTE: these three checks are TEXT_PATTERN's, one at a time so the answer names the one
        # broken; str.strip() drops exactly BLANK_CHARACTERS (a unit test compares them).
        if not value.strip():
            raise _invalid(name, "must not be empty")
        if len(value) > self.max_chars:
            raise _invalid(name, f"must be at most {self.max_chars} characters")
        if "\x00" in value:
            raise _invalid(name, "must not contain NUL characters")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise _invalid(name, "must be valid Unicode (no lone surrogate escapes)") from None
        return value


@dataclass(frozen=True)
class Uuid:
    """A UUID string in its 8-4-4-4-12 hex spelling, or null."""

    description: str = ""

    def schema(self) -> Schema:
        """Returns the JSON Schema of the field."""
        return _described({"anyOf": [{"type": "string", "format": "uuid", "pattern": UUID_PATTERN},
                                     {"type": "null"}]}, self.description)

    def check(self, value: object, name: str) -> uuid.UUID | None:
        """Returns the UUID (None for null); raises a 422 naming `name` otherwise."""
        if value is None:
            return None
        if not isinstance(value, str) or not _UUID_RE.fullmatch(value):
            raise _invalid(name, "must be a UUID string (8-4-4-4-12 hex digits)")
        return uuid.UUID(value)


@dataclass(frozen=True)
class Instant:
    """An ISO 8601 date-time from now to `horizon` seconds ahead (no offset means UTC).

    NOTE: "not in the past" depends on the clock, so the schema states only the shape and the
    description the window; a time already past answers 422.
    """

    horizon: int
    description: str = ""

    def schema(self) -> Schema:
        """Returns the JSON Schema of the field."""
        return _described({"type": "string", "format": "date-time", "pattern": INSTANT_PATTERN},
                          self.description)

    def check(self, value: object, name: str) -> datetime:
        """Returns the instant (aware); raises a 422 naming `name` when malformed, past or too far."""
        if not isinstance(value, str) or not _INSTANT_RE.fullmatch(value):
            raise _invalid(name, "must be an ISO 8601 date-time (e.g. 2026-12-01T02:00:00Z)")
        instant = datetime.fromisoformat(value.replace("Z", "+00:00"))
        instant = instant if instant.tzinfo is not None else instant.replace(tzinfo=UTC)
        now = datetime.now(UTC)
        if instant < now:
            raise _invalid(name, "is in the past")
        if instant > now + timedelta(seconds=self.horizon):
            raise _invalid(name, f"must be at most {self.horizon} seconds from now")
        return instant


@dataclass(frozen=True)
class Fields:
    """A JSON object with only these fields; absent ones are left out of the checked result.

    With a `component` name, the document holds its schema once and every use refers to it.
    """

    fields: dict[str, Spec]
    required: tuple[str, ...] = ()
    description: str = ""
    unknown: str = "unknown field"
    component: str | None = None
    exclusive: tuple[tuple[str, str], ...] = ()
    """Pairs of fields that may not both be given."""

    def schema(self) -> Schema:
        """Returns the JSON Schema of the object (its own, even when it is a component)."""
        schema: Schema = {"type": "object", "additionalProperties": False,
                          "properties": {name: _use(spec) for name, spec in self.fields.items()}}
        if self.required:
            schema["required"] = list(self.required)
        if self.exclusive:
            schema["allOf"] = [{"not": {"required": list(pair)}} for pair in self.exclusive]
        return _described(schema, self.description)

    def check(self, value: object, name: str) -> dict[str, Any]:
        """Returns the checked fields present; raises a 422 naming the first bad one.

        Args:
            value: the decoded JSON.
            name: the object's own name (`options`); empty for a whole body.

        Raises:
            falcon.HTTPUnprocessableEntity: not an object, or a field unknown, missing or bad.
        """
        if not isinstance(value, dict):
            if name:
                raise _invalid(name, "must be an object")
            raise falcon.HTTPUnprocessableEntity(title="Invalid body",
                                                 description="The body must be a JSON object.")
        prefix = f"{name}." if name else ""
        unknown = sorted(set(value) - set(self.fields))
        if unknown:
            raise _invalid(prefix + unknown[0], self.unknown)
        for required in self.required:
            if required not in value:
                raise _invalid(prefix + required, "is required")
        for first, second in self.exclusive:
            if first in value and second in value:
                raise _invalid(prefix + second, f"cannot be given with {first}")
        return {field_name: spec.check(value[field_name], prefix + field_name)
                for field_name, spec in self.fields.items() if field_name in value}


@dataclass(frozen=True)
class Number:
    """A finite JSON number within [low, high] (integers too; NaN and Infinity never parse)."""

    low: float
    high: float
    description: str = ""

    def schema(self) -> Schema:
        """Returns the JSON Schema of the field."""
        return _described({"type": "number", "minimum": self.low, "maximum": self.high},
                          self.description)

    def check(self, value: object, name: str) -> float:
        """Returns the value as a float; raises a 422 naming `name` otherwise."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _invalid(name, "must be a number")
        if not self.low <= value <= self.high:
            raise _invalid(name, f"must be between {self.low:g} and {self.high:g}")
        return float(value)


@dataclass(frozen=True)
class Choice:
    """One string of a fixed list."""

    values: tuple[str, ...]
    description: str = ""

    def schema(self) -> Schema:
        """Returns the JSON Schema of the field."""
        return _described({"type": "string", "enum": list(self.values)}, self.description)

    def check(self, value: object, name: str) -> str:
        """Returns the value; raises a 422 naming `name` and the choices otherwise."""
        if not isinstance(value, str) or value not in self.values:
            raise _invalid(name, f"must be one of: {', '.join(self.values)}")
        return value


@dataclass(frozen=True)
class OneOrMore:
    """One text, or a list of 1 to `max_items` texts (OpenAI's `stop`); always a list once checked."""

    item: Text
    max_items: int
    description: str = ""

    def schema(self) -> Schema:
        """Returns the JSON Schema of the field."""
        return _described({"anyOf": [self.item.schema(),
                                     {"type": "array", "minItems": 1, "maxItems": self.max_items,
                                      "items": self.item.schema()}]}, self.description)

    def check(self, value: object, name: str) -> list[str]:
        """Returns the texts as a list; raises a 422 naming `name` (and the bad item) otherwise."""
        if isinstance(value, str):
            return [self.item.check(value, name)]
        if not isinstance(value, list) or not 1 <= len(value) <= self.max_items:
            raise _invalid(name, f"must be a string or a list of 1 to {self.max_items} strings")
        return [self.item.check(item, f"{name}[{i}]") for i, item in enumerate(value)]




@dataclass(frozen=True)
class Items:
    """A JSON array of 1 to `max_items` objects, each checked by `item`.

    NOTE: every item is checked, and the 422 names each bad one by its index (`prompts[3].text:
    ...`), so a client fixes a whole batch in one round.
    """

    item: Fields
    max_items: int
    description: str = ""

    def schema(self) -> Schema:
        """Returns the JSON Schema of the field."""
        return _described({"type": "array", "minItems": 1, "maxItems": self.max_items,
                           "items": _use(self.item)}, self.description)

    def check(self, value: object, name: str) -> list[dict[str, Any]]:
        """Returns the checked items; raises one 422 naming every bad item otherwise."""
        if not isinstance(value, list):
            raise _invalid(name, "must be an array")
        if not 1 <= len(value) <= self.max_items:
            raise _invalid(name, f"must hold 1 to {self.max_items} items")
        checked, errors = [], []
        for index, element in enumerate(value):
            try:
                checked.append(self.item.check(element, f"{name}[{index}]"))
            except falcon.HTTPUnprocessableEntity as error:
                errors.append(str(error.description))
        if errors:
            raise falcon.HTTPUnprocessableEntity(title="Invalid field",
                                                 description="; ".join(errors))
        return checked


Spec = Integer | Number | Choice | OneOrMore | Text | Uuid | Instant | Items | Fields


def _use(spec: Spec) -> Schema:
    if isinstance(spec, Fields) and spec.component:
        return {"$ref": f"#/components/schemas/{spec.component}"}
    return spec.schema()


MAX_SYSTEM_CHARS = 100_000
MAX_STOP_CHARS = 200
MAX_STOPS = 4
MAX_OUTPUT_TOKENS = 1_000_000
MAX_SEED = 2**63 - 1

_OPTION_FIELDS: dict[str, Spec] = {
    "model": Text(MAX_MODEL_CHARS, "Provider model (default SA_PROVIDER_MODEL); it picks the "
                                   "model route, and a model no route serves answers 422."),
    "depth": Integer(0, MAX_DEPTH, DEFAULT_DEPTH, "Ancestors sent to the provider as context."),
    "system": Text(MAX_SYSTEM_CHARS, "A system prompt, sent first, before the ancestors."),
    "temperature": Number(0, 2, "Sampling temperature, sent as is."),
    "top_p": Number(0, 1, "Nucleus sampling mass, sent as is."),
    "max_tokens": Integer(1, MAX_OUTPUT_TOKENS, description="Most tokens the reply may hold."),
    "stop": OneOrMore(Text(MAX_STOP_CHARS), MAX_STOPS,
                      "Where the provider stops: one string or up to four (stored as a list)."),
    "response_format": Fields(
        {"type": Choice(("text", "json_object"), "`json_object` asks for JSON mode.")},
        required=("type",), description="OpenAI's response_format: text or JSON mode."),
    "seed": Integer(-MAX_SEED - 1, MAX_SEED, description="Sampling seed, for providers that "
                                                         "honour one.")}

OPTIONS = Fields(
    _OPTION_FIELDS, description="Execution options; only these keys are accepted.",
    unknown=f"unknown option (allowed: {', '.join(_OPTION_FIELDS)})", component="ExecutionOptions")
"""The `options` of POST /prompt: what the worker can use (claim.options_error reads the same)."""

OPTION_KEYS = tuple(_OPTION_FIELDS)


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
        "options": OPTIONS,
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


def check_routable(options: dict[str, Any], routes: Routes) -> None:
    """Refuses a model no route serves, so it is a 422 now rather than a failed job later.

    NOTE: a web process configured with no provider at all (only workers call one) judges
    nothing; the worker fails such a job as `invalid_options`.

    Raises:
        falcon.HTTPUnprocessableEntity: `options.model` (or the default model) has no route.
    """
    if routes and routes.for_model(options.get("model")) is None:
        model = options.get("model") or routes.default_model
        raise _invalid("options.model", f"no route serves model {model!r} (known: "
                                        f"{', '.join(routes.known_models)})")


NO_BODY = Fields({}, description="No body is needed; an empty JSON object is accepted, anything "
                                 "else is a 422.", unknown="unknown field (this route takes no body)")
"""The body of a route that takes none: absent, or an empty JSON object."""


def parse_no_body(body: object) -> None:
    """Validates the body of a route that takes none: absent, or an empty JSON object.

    Raises:
        falcon.HTTPUnprocessableEntity: the body holds anything else.
    """
    if body is None:
        return
    if not isinstance(body, dict):
        raise falcon.HTTPUnprocessableEntity(
            title="Invalid body", description="This route takes no body (or an empty JSON object).")
    NO_BODY.check(body, "")


@dataclass(frozen=True)
class Param:
    """A query parameter or header: its name, where it goes, and its JSON Schema."""

    name: str
    where: Literal["query", "header"]
    schema: Schema
    description: str

    def openapi(self) -> dict[str, Any]:
        """Returns the OpenAPI parameter object."""
        return {"name": self.name, "in": self.where, "required": False,
                "description": self.description, "schema": self.schema}


SINCE = Param("since", "query", {"type": "string", "pattern": SINCE_PATTERN},
              "A first call's start: ISO 8601 date or date-time (no offset means UTC). Without it "
              "and without `cursor`, the feed starts at the beginning of the log.")
CURSOR = Param("cursor", "query", {"type": "string", "pattern": CURSOR_PATTERN},
               "The previous answer's `next_cursor` (opaque). Wins over `since`.")
RECENT_LIMIT = Param("limit", "query", {"type": "integer", "minimum": 1,
                                        "maximum": RECENT_LIMIT_MAX,
                                        "default": RECENT_LIMIT_DEFAULT},
                     "Most transitions read, hence most items answered.")
SCOPE = Param("scope", "query", {"type": "string", "enum": list(SCOPES), "default": SCOPES[0]},
              "`user`: the caller's own prompts (the default); `org`: every prompt of the "
              "caller's org (an explicit opt-in).")
LAST_EVENT_ID_HEADER = Param("Last-Event-ID", "header",
                             {"type": "string", "pattern": EVENT_ID_PATTERN},
                             f"The last event id received (0 to {MAX_EVENT_ID}).")
LAST_EVENT_ID = Param("last_event_id", "query",
                      {"type": "integer", "minimum": 0, "maximum": MAX_EVENT_ID},
                      "As Last-Event-ID, for clients that cannot send it; the header wins (both "
                      "must be valid).")
IDEMPOTENCY_KEY = Param("Idempotency-Key", "header",
                        {"type": "string", "minLength": 1, "maxLength": MAX_KEY_LENGTH,
                         "pattern": _KEY_PATTERN},
                        f"1 to {MAX_KEY_LENGTH} visible ASCII characters; scoped to the caller's "
                        "org and user.")

PREFER = Param("Prefer", "header", {"type": "string", "pattern": _PREFER_PATTERN},
               f"`wait=N` (N from 0 to {MAX_WAIT_SECONDS}, RFC 7240): hold the answer up to N "
               "seconds for the job to finish; finished in time answers 200 with the job and "
               "`response_text`, else the usual 202. No other preference is taken.")


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
    return since if since.tzinfo is not None else since.replace(tzinfo=UTC)


def parse_limit(req: falcon.Request) -> int:
    """Parses `limit` of /mission/recent (absent means the default).

    Raises:
        falcon.HTTPInvalidParam: not an integer within the documented bounds.
    """
    limit = req.get_param_as_int(RECENT_LIMIT.name, min_value=RECENT_LIMIT.schema["minimum"],
                                 max_value=RECENT_LIMIT.schema["maximum"],
                                 default=RECENT_LIMIT.schema["default"])
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


def parse_cursor(raw: str | None) -> int | None:
    """Parses a `cursor` from a previous /mission/recent answer (absent means a first call).

    Raises:
        falcon.HTTPInvalidParam: not a cursor this service hands out.
    """
    if raw is None:
        return None
    if not _CURSOR_RE.fullmatch(raw):
        raise falcon.HTTPInvalidParam("must be the `next_cursor` of a previous answer", CURSOR.name)
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
