"""OpenAI chat requests translated to sa-core's execution options, checked field by field.

Pure: one translation serves `POST /openai/v1/chat/completions` (service/openai/) and every line
of a batch (jobqueue/engine/batch_lines.py). A field sa-core maps is checked and kept; a field it
cannot honour is refused, naming the field (never dropped silently). The request's `messages`
are kept as given (content parts of type `text` joined into one string) and sent to the
provider as they are: the job carries them in its execution options, with `depth` 0 so no
ancestor is read.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_MESSAGES", "MAX_MODEL_CHARS", "MAX_OUTPUT_TOKENS", "ROLES", "ChatInvalid",
           "ChatRequest", "parse_chat"]

MAX_MESSAGES = 1000
"""Most messages one request may carry."""

MAX_MODEL_CHARS = 200
MAX_OUTPUT_TOKENS = 1_000_000
MAX_STOPS = 4
MAX_STOP_CHARS = 200
MAX_SEED = 2**63 - 1
ROLES = ("system", "developer", "user", "assistant")
"""Roles a message may have: tool calls are not supported, so no `tool` (or `function`) role."""

_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")

# NOTE: what an SDK's own answer holds when a client appends it to the history it sends back
# (`message.model_dump()`): harmless when empty, refused otherwise.
_EMPTY_WHEN_ECHOED = frozenset({"refusal", "tool_calls", "function_call", "audio", "annotations"})

_UNSUPPORTED = {
    "tools": "tool calls are not supported",
    "tool_choice": "tool calls are not supported",
    "functions": "function calls are not supported",
    "function_call": "function calls are not supported",
    "parallel_tool_calls": "tool calls are not supported",
    "logit_bias": "logit_bias is not supported",
    "top_logprobs": "log probabilities are not supported",
    "audio": "audio output is not supported",
    "modalities": "only text output is supported",
    "prediction": "predicted outputs are not supported",
    "reasoning_effort": "reasoning_effort is not supported",
    "verbosity": "verbosity is not supported",
    "service_tier": "service tiers are not supported: every request is durable, at its lane's priority",
    "web_search_options": "web search is not supported",
    "metadata": "metadata is not stored for chat requests",
    "user": "`user` is not recorded: sa-core attributes every request to its token's user",
    "prompt_cache_key": "prompt_cache_key is not supported",
    "safety_identifier": "safety_identifier is not supported",
}
"""Fields of OpenAI's chat request that sa-core refuses, with the reason given (n, logprobs and
store are accepted at the value sa-core honours, see `_check_noops`)."""


class ChatInvalid(ValueError):
    """A chat request sa-core cannot run as given: which field (`param`), why, and a code."""

    def __init__(self, message: str, param: str | None, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


@dataclass(frozen=True)
class ChatRequest:
    """A checked chat request: the job's options, its display text, and how to answer."""

    options: dict[str, Any]
    text: str
    stream: bool = False
    include_usage: bool = False
    model: str = field(default="")


def _bad(param: str, why: str, code: str = "invalid_value") -> ChatInvalid:
    return ChatInvalid(f"Invalid value for '{param}': {why}.", param, code)


def _text(value: object, param: str, max_chars: int, *, blank_ok: bool = False) -> str:
    if not isinstance(value, str):
        raise _bad(param, "expected a string")
    if not blank_ok and not value.strip():
        raise _bad(param, "must not be empty")
    if len(value) > max_chars:
        raise _bad(param, f"at most {max_chars} characters", "string_above_max_length")
    if "\x00" in value:
        raise _bad(param, "must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad(param, "must be valid Unicode (no lone surrogate)") from None
    return value


def _number(value: object, param: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(param, "expected a number")
    if not low <= value <= high:
        raise _bad(param, f"must be between {low:g} and {high:g}", "decimal_out_of_range")
    return float(value)


def _integer(value: object, param: str, low: int, high: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(param, "expected an integer")
    if not low <= value <= high:
        raise _bad(param, f"must be between {low} and {high}", "integer_out_of_range")
    return value


def _content(value: object, param: str, max_chars: int) -> str:
    """A message's content: a string, or a list of `text` parts (joined as one string)."""
    if isinstance(value, list):
        if not value:
            raise _bad(param, "expected a string or a non-empty list of text parts")
        texts = []
        for i, part in enumerate(value):
            where = f"{param}[{i}]"
            if not isinstance(part, dict) or part.get("type") != "text":
                raise ChatInvalid(f"Invalid value for '{where}': only parts of type 'text' are "
                                  "supported.", where, "unsupported_content")
            if set(part) - {"type", "text"}:
                raise _bad(where, f"unknown field {sorted(set(part) - {'type', 'text'})[0]!r}")
            texts.append(_text(part.get("text"), f"{where}.text", max_chars, blank_ok=True))
        value = "".join(texts)
    return _text(value, param, max_chars, blank_ok=True)


def _message(value: object, index: int, max_chars: int) -> dict[str, str]:
    param = f"messages[{index}]"
    if not isinstance(value, dict):
        raise _bad(param, "expected an object")
    role = value.get("role")
    if role not in ROLES:
        why = ("tool messages are not supported" if role in ("tool", "function")
               else f"role must be one of {', '.join(ROLES)}")
        raise _bad(f"{param}.role", why)
    for key, item in value.items():
        if key in ("role", "content", "name"):
            continue
        if key in _EMPTY_WHEN_ECHOED and item in (None, [], ""):
            continue
        raise _bad(f"{param}.{key}", "this message field is not supported")
    if "content" not in value or value["content"] is None:
        raise _bad(f"{param}.content", "required (tool calls are not supported)")
    message = {"role": str(role), "content": _content(value["content"], f"{param}.content",
                                                      max_chars)}
    name = value.get("name")
    if name is not None:
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise _bad(f"{param}.name", "1 to 64 letters, digits, underscores or hyphens")
        message["name"] = name
    return message


def _messages(value: object, max_chars: int) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise _bad("messages", "expected a non-empty array")
    if len(value) > MAX_MESSAGES:
        raise _bad("messages", f"at most {MAX_MESSAGES} messages", "array_above_max_length")
    return [_message(item, i, max_chars) for i, item in enumerate(value)]


def _stop(value: object) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_STOPS:
        raise _bad("stop", f"a string or a list of 1 to {MAX_STOPS} strings")
    return [_text(item, "stop", MAX_STOP_CHARS) for item in items]


def _response_format(value: object) -> dict[str, Any]:
    if not isinstance(value, dict) or value.get("type") not in ("text", "json_object",
                                                                  "json_schema"):
        raise _bad("response_format", "type must be text, json_object or json_schema")
    if value["type"] != "json_schema":
        if set(value) != {"type"}:
            raise _bad("response_format", "only `type` is allowed with text or json_object")
        return {"type": value["type"]}
    schema = value.get("json_schema")
    if set(value) != {"type", "json_schema"} or not isinstance(schema, dict):
        raise _bad("response_format.json_schema", "expected an object")
    if not isinstance(schema.get("name"), str) or not _NAME_RE.fullmatch(schema["name"]):
        raise _bad("response_format.json_schema.name", "1 to 64 letters, digits, _ or -")
    unknown = set(schema) - {"name", "description", "schema", "strict"}
    if unknown:
        raise _bad(f"response_format.json_schema.{sorted(unknown)[0]}", "unknown field")
    # NOTE: passed to the provider as given; the body's size bound bounds the schema too.
    return {"type": "json_schema", "json_schema": schema}


def _check_noops(body: dict[str, Any]) -> None:
    """Accepts the fields whose value is what sa-core does anyway; refuses the others."""
    if body.get("n") not in (None, 1):
        raise _bad("n", "only one choice per request (n = 1) is supported")
    if body.get("logprobs") not in (None, False):
        raise _bad("logprobs", "log probabilities are not supported")
    if body.get("store") not in (None, True):
        raise _bad("store", "sa-core stores every request and its answer (store = true)")


_MAPPED = frozenset({"model", "messages", "temperature", "top_p", "max_tokens",
                     "max_completion_tokens", "stop", "seed", "response_format",
                     "presence_penalty", "frequency_penalty", "stream", "stream_options", "n",
                     "logprobs", "store", "prefer_provider"})
"""OpenAI's fields sa-core honours, and `prefer_provider`, its own (an SDK's `extra_body`): the
model route to call among those serving the model."""


def _options(body: dict[str, Any]) -> dict[str, Any]:
    """The sampling options that are given (null meaning absent), checked."""
    given = {name: value for name, value in body.items() if value is not None}
    options: dict[str, Any] = {}
    if "temperature" in given:
        options["temperature"] = _number(given["temperature"], "temperature", 0, 2)
    if "top_p" in given:
        options["top_p"] = _number(given["top_p"], "top_p", 0, 1)
    for name in ("presence_penalty", "frequency_penalty"):
        if name in given:
            options[name] = _number(given[name], name, -2, 2)
    if "max_tokens" in given and "max_completion_tokens" in given:
        raise _bad("max_completion_tokens", "give max_tokens or max_completion_tokens, not both")
    for name in ("max_tokens", "max_completion_tokens"):
        if name in given:
            options["max_tokens"] = _integer(given[name], name, 1, MAX_OUTPUT_TOKENS)
    if "stop" in given:
        options["stop"] = _stop(given["stop"])
    if "seed" in given:
        options["seed"] = _integer(given["seed"], "seed", -MAX_SEED - 1, MAX_SEED)
    if "response_format" in given:
        options["response_format"] = _response_format(given["response_format"])
    if "prefer_provider" in given:
        options["prefer_provider"] = _text(given["prefer_provider"], "prefer_provider",
                                           MAX_MODEL_CHARS)
    return options


def _streaming(body: dict[str, Any], batch: bool) -> tuple[bool, bool]:
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _bad("stream", "expected a boolean")
    if stream and batch:
        raise _bad("stream", "a batch request cannot stream")
    stream_options = body.get("stream_options")
    if stream_options is None:
        return bool(stream), False
    if not stream:
        raise _bad("stream_options", "only allowed when stream is true")
    if not isinstance(stream_options, dict) or set(stream_options) - {"include_usage"}:
        raise _bad("stream_options", "only include_usage is supported")
    include = stream_options.get("include_usage", False)
    if not isinstance(include, bool):
        raise _bad("stream_options.include_usage", "expected a boolean")
    return True, include


def parse_chat(body: object, max_chars: int, *, batch: bool = False) -> ChatRequest:
    """Checks an OpenAI chat completion request and translates it to a job's options.

    Args:
        body: the decoded JSON body (or a batch line's `body`).
        max_chars: the most characters one message's content may hold (SA_MAX_PROMPT_CHARS).
        batch: a batch line: `stream` must not be true.

    Returns:
        The options (model, messages as given, depth 0, the sampling fields given), the text
        shown as the prompt (the last user message), and the answer's streaming flags.

    Raises:
        ChatInvalid: a field is missing, malformed, out of range, or one sa-core cannot honour.
    """
    if not isinstance(body, dict):
        raise ChatInvalid("The body must be a JSON object.", None, "invalid_json")
    for name in body:
        if name in _UNSUPPORTED and body[name] is not None:
            raise ChatInvalid(f"Unsupported parameter: '{name}': {_UNSUPPORTED[name]}.", name,
                              "unsupported_parameter")
        if name not in _MAPPED and name not in _UNSUPPORTED:
            raise ChatInvalid(f"Unrecognized request argument supplied: {name}", name,
                              "unknown_parameter")
    if "model" not in body:
        raise ChatInvalid("Missing required parameter: 'model'.", "model", "missing_required_parameter")
    if "messages" not in body:
        raise ChatInvalid("Missing required parameter: 'messages'.", "messages",
                          "missing_required_parameter")
    _check_noops(body)
    model = _text(body["model"], "model", MAX_MODEL_CHARS)
    messages = _messages(body["messages"], max_chars)
    stream, include_usage = _streaming(body, batch)
    options = {"model": model, "messages": messages, "depth": 0, **_options(body)}
    users = [m["content"] for m in messages if m["role"] == "user"]
    text = users[-1] if users else messages[-1]["content"]
    return ChatRequest(options=options, text=text, stream=stream, include_usage=include_usage,
                       model=model)
