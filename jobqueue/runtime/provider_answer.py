"""An OpenAI-compatible answer read into a Completion, or a classified ProviderFailure; no I/O.

The client (jobqueue/runtime/provider.py) hands over the bytes it read; what they say, whether
Postgres can store them and which error_kind a refusal is, is decided here.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import orjson

from jobqueue.core.policy import ErrorKind
from jobqueue.core.token_estimate import RateLimitHeaders

__all__ = ["Completion", "ProviderFailure", "TooLarge", "check_storable", "completion_from",
           "elapsed_ms", "error_message", "parse_answer", "unreadable"]

# NOTE: keep stored error messages short; provider bodies can be large.
_MESSAGE_LIMIT = 500


@dataclass(frozen=True)
class Completion:
    """A successful chat completion and what the ledger records about it."""

    content: str
    model: str
    tokens_in: int | None
    tokens_out: int | None
    http_status: int
    latency_ms: int
    request_id: str | None
    ratelimit: RateLimitHeaders | None = None


class ProviderFailure(Exception):
    """A provider call that did not produce a completion, already classified."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        http_status: int | None = None,
        retry_after: float | None = None,
        latency_ms: int = 0,
        ratelimit: RateLimitHeaders | None = None,
    ) -> None:
        super().__init__(message)
        self.ratelimit = ratelimit
        self.kind = kind
        self.message = message[:_MESSAGE_LIMIT]
        self.http_status = http_status
        self.retry_after = retry_after
        self.latency_ms = latency_ms



class TooLarge(Exception):
    """An answer past SA_PROVIDER_MAX_RESPONSE_BYTES (its status kept for the failure)."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status



def _text(data: bytes) -> str:
    """The start of a body for an error message, in text Postgres can store (no NUL)."""
    return data[:_MESSAGE_LIMIT].decode("utf-8", "replace").replace("\x00", "\ufffd")


def error_message(data: bytes) -> str:
    """The message of an error body as OpenAI, Azure, vLLM or Ollama write it, else its start.

    OpenAI and Azure: `{"error": {"message": ...}}`; vLLM: `{"object": "error", "message": ...}`;
    Ollama: `{"error": "..."}` (tests/test_conformance.py replays each).
    """
    try:
        body: Any = json.loads(data)
    except ValueError:
        return _text(data)
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        error = error.get("message")
    message = error if isinstance(error, str) else (
        body.get("message") if isinstance(body, dict) else None)
    if not isinstance(message, str) or not message.strip():
        return _text(data)
    return _text(message.encode())


def elapsed_ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def check_storable(text: str) -> None:
    """Refuses text Postgres cannot store, so the call fails once as `parse` (not later, retried).

    Raises:
        ValueError: a NUL character or a lone surrogate (UnicodeEncodeError is a ValueError).
    """
    if "\x00" in text:
        raise ValueError("the text contains a NUL character")
    text.encode("utf-8")


def unreadable(exc: Exception, data: bytes, status: int, latency_ms: int) -> ProviderFailure:
    return ProviderFailure(
        ErrorKind.PARSE,
        f"unreadable provider response ({type(exc).__name__}: {str(exc)[:100]}): {_text(data)}",
        http_status=status,
        latency_ms=latency_ms,
    )


def parse_answer(data: bytes, status: int, model: str, latency_ms: int) -> Completion:
    try:
        # PERF: orjson, as provider_stream.py decodes each chunk: an answer's text is most of it.
        body: Any = orjson.loads(data)
        content = body["choices"][0]["message"]["content"]
        if not isinstance(content, str):
            raise TypeError("message content is not a string")
        usage = body.get("usage") or {}
        return completion_from(body, content, usage, model, status, latency_ms)
    except (ValueError, LookupError, TypeError, AttributeError) as exc:
        raise unreadable(exc, data, status, latency_ms) from exc


def completion_from(body: dict[str, Any], content: str, usage: dict[str, Any], model: str,
                status: int, latency_ms: int) -> Completion:
    """Builds the completion from the answer's fields, refusing any Postgres cannot store.

    Raises:
        ValueError, TypeError: a field is unusable.
    """
    completion = Completion(
        content=content,
        model=str(body.get("model") or model),
        tokens_in=_count(usage.get("prompt_tokens")),
        tokens_out=_count(usage.get("completion_tokens")),
        http_status=status,
        latency_ms=latency_ms,
        request_id=None if body.get("id") is None else str(body["id"]),
    )
    for text in (completion.content, completion.model, completion.request_id or ""):
        check_storable(text)
    return completion


def _count(value: Any) -> int | None:
    """A token count as an int column takes it, or None for anything else."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31:
        return value
    return None
