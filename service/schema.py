"""A small schema kit: each field type checks a decoded JSON value and writes its JSON Schema.

A type's `check` raises the 422 that names the field and the rule it breaks; its `schema` is what
the OpenAPI document publishes for it, so a declaration built from these types (the request
contract, `service/contract.py`) is enforced and documented by the same object.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import falcon

__all__ = [
    "BLANK_CHARACTERS",
    "INSTANT_PATTERN",
    "NON_EMPTY_TEXT_PATTERN",
    "SINCE_PATTERN",
    "TEXT_PATTERN",
    "UUID_PATTERN",
    "Choice",
    "Fields",
    "Ids",
    "Instant",
    "Integer",
    "Items",
    "Number",
    "OneOrMore",
    "Param",
    "Schema",
    "Spec",
    "Text",
    "Uuid",
    "invalid",
]

Schema = dict[str, Any]

UUID_PATTERN = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
"""The only spelling of a UUID accepted in a body (`uuid.UUID` alone also takes braces, URNs...)."""

BLANK_CHARACTERS = (r"\t\n\u000b\f\r\u001c-\u001f \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029"
                    r"\u202f\u205f\u3000")
"""A character class of exactly the characters `str.isspace()` calls blank, spelled with escapes
that Python's `re` and the ECMA-262 regexes of JSON Schema read alike (their `\\s` differ)."""

TEXT_PATTERN = f"^[{BLANK_CHARACTERS}]*[^\\u0000{BLANK_CHARACTERS}][^\\u0000]*$"
"""A text field: not blank, no NUL character. Linear to match, even on a long blank string."""

NON_EMPTY_TEXT_PATTERN = "^[^\\u0000]+$"
"""A text field that may be blank (`Text(blank=True)`): not empty, no NUL character."""

_YEAR = "(000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})"
# NOTE: a century is a leap year when divisible by 400; year 0000 does not exist (Python refuses it).
_LEAP_YEAR = "([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)"
_MONTH_DAY = ("((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
              "|02-(0[1-9]|1[0-9]|2[0-8]))")
SINCE_PATTERN = (
    f"^({_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
    r"([T ]([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9]([.][0-9]{1,6})?)?"
    r"(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])?)?$"
)
"""What `since` may look like: a real ISO 8601 date or date-time, offset optional (none means UTC;
any offset up to +-23:59, as Python reads it).

NOTE: the calendar (month lengths, leap years, no year 0) is in the pattern itself, so every
string the document allows names an instant and is answered 200, never 400.
"""

INSTANT_PATTERN = (
    f"^({_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
    r"[T ]([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9]([.][0-9]{1,6})?)?"
    r"(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])?$"
)
"""An instant in a body (`run_at`): an ISO 8601 date-time, as SINCE_PATTERN but with the time
required (a bare date is ambiguous for a schedule); no offset means UTC."""


_UUID_RE = re.compile(UUID_PATTERN)
_INSTANT_RE = re.compile(INSTANT_PATTERN)


def invalid(name: str, why: str) -> falcon.HTTPUnprocessableEntity:
    """The 422 of a field that breaks its rule: `{name}: {why}`."""
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
            raise invalid(name, "must be an integer")
        if not self.low <= value <= self.high:
            raise invalid(name, f"must be between {self.low} and {self.high}")
        return value


@dataclass(frozen=True)
class Text:
    """A non-blank string of at most `max_chars` characters, with no NUL (Postgres text cannot
    hold one) and no lone surrogate (JSON may spell one, UTF-8 cannot). With `blank`, blanks
    alone are a value too (a stop sequence "\\n\\n"); only the empty string is refused."""

    max_chars: int
    description: str = ""
    blank: bool = False

    def schema(self) -> Schema:
        """Returns the JSON Schema of the field (lone surrogates are in the description only:
        JSON Schema cannot name them)."""
        return _described({"type": "string", "minLength": 1, "maxLength": self.max_chars,
                           "pattern": NON_EMPTY_TEXT_PATTERN if self.blank else TEXT_PATTERN},
                          self.description)

    def check(self, value: object, name: str) -> str:
        """Returns the value; raises a 422 naming `name` and the rule it breaks otherwise."""
        if not isinstance(value, str):
            raise invalid(name, "must be a string")
        # NOTE: these three checks are TEXT_PATTERN's, one at a time so the answer names the one
        # broken; str.strip() drops exactly BLANK_CHARACTERS (a unit test compares them).
        if not (value if self.blank else value.strip()):
            raise invalid(name, "must not be empty")
        if len(value) > self.max_chars:
            raise invalid(name, f"must be at most {self.max_chars} characters")
        if "\x00" in value:
            raise invalid(name, "must not contain NUL characters")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise invalid(name, "must be valid Unicode (no lone surrogate escapes)") from None
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
            raise invalid(name, "must be a UUID string (8-4-4-4-12 hex digits)")
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
            raise invalid(name, "must be an ISO 8601 date-time (e.g. 2026-12-01T02:00:00Z)")
        instant = datetime.fromisoformat(value.replace("Z", "+00:00"))
        # NOTE: in UTC from here on: Postgres reads offsets up to 15:59 only, and refuses a
        # wider one in an array (a batch's run_at) with a 500.
        instant = (instant.astimezone(UTC) if instant.tzinfo is not None
                   else instant.replace(tzinfo=UTC))
        now = datetime.now(UTC)
        if instant < now:
            raise invalid(name, "is in the past")
        if instant > now + timedelta(seconds=self.horizon):
            raise invalid(name, f"must be at most {self.horizon} seconds from now")
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
                raise invalid(name, "must be an object")
            raise falcon.HTTPUnprocessableEntity(title="Invalid body",
                                                 description="The body must be a JSON object.")
        prefix = f"{name}." if name else ""
        unknown = sorted(set(value) - set(self.fields))
        if unknown:
            raise invalid(prefix + unknown[0], self.unknown)
        for required in self.required:
            if required not in value:
                raise invalid(prefix + required, "is required")
        for first, second in self.exclusive:
            if first in value and second in value:
                raise invalid(prefix + second, f"cannot be given with {first}")
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
            raise invalid(name, "must be a number")
        if not self.low <= value <= self.high:
            raise invalid(name, f"must be between {self.low:g} and {self.high:g}")
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
            raise invalid(name, f"must be one of: {', '.join(self.values)}")
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
            raise invalid(name, f"must be a string or a list of 1 to {self.max_items} strings")
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
            raise invalid(name, "must be an array")
        if not 1 <= len(value) <= self.max_items:
            raise invalid(name, f"must hold 1 to {self.max_items} items")
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


@dataclass(frozen=True)
class Ids:
    """A JSON array of 1 to `max_items` distinct UUID strings (a selection of jobs)."""

    max_items: int
    description: str = ""

    def schema(self) -> Schema:
        """Returns the JSON Schema of the field."""
        return _described({"type": "array", "minItems": 1, "maxItems": self.max_items,
                           "uniqueItems": True,
                           "items": {"type": "string", "format": "uuid", "pattern": UUID_PATTERN}},
                          self.description)

    def check(self, value: object, name: str) -> list[uuid.UUID]:
        """Returns the UUIDs; raises a 422 naming `name` (and the bad item) otherwise."""
        if not isinstance(value, list) or not 1 <= len(value) <= self.max_items:
            raise invalid(name, f"must be a list of 1 to {self.max_items} job ids")
        ids = []
        for index, item in enumerate(value):
            if not isinstance(item, str) or not _UUID_RE.fullmatch(item):
                raise invalid(f"{name}[{index}]", "must be a UUID string (8-4-4-4-12 hex digits)")
            ids.append(uuid.UUID(item))
        if len(set(ids)) != len(ids):
            raise invalid(name, "must not repeat an id")
        return ids


Spec = Integer | Number | Choice | OneOrMore | Text | Uuid | Instant | Items | Fields | Ids


def _use(spec: Spec) -> Schema:
    if isinstance(spec, Fields) and spec.component:
        return {"$ref": f"#/components/schemas/{spec.component}"}
    return spec.schema()


@dataclass(frozen=True)
class Param:
    """A query parameter or header: its name, where it goes, its JSON Schema and an example."""

    name: str
    where: Literal["query", "header"]
    schema: Schema
    description: str
    example: Any

    def openapi(self) -> dict[str, Any]:
        """Returns the OpenAPI parameter object."""
        return {"name": self.name, "in": self.where, "required": False,
                "description": self.description, "schema": self.schema, "example": self.example}

