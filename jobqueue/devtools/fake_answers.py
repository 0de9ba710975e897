"""The fake provider's bodies: a deterministic completion, its streamed chunks, and the error
bodies of each server family, built apart from the HTTP server that sends them."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

__all__ = ["REPLIES", "UNAUTHORIZED", "completion", "error_body", "max_tokens_of",
           "stream_events", "valid_messages"]

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 422: "invalid_request_error", 429: "rate_limit_error"}

UNAUTHORIZED = {
    "openai": "Incorrect API key provided.",
    "azure": "Access denied due to invalid subscription key or wrong API endpoint. Make sure to "
             "provide a valid key for an active subscription and use a correct regional API "
             "endpoint for your resource.",
    "vllm": "Unauthorized",
    "ollama": "unauthorized",
}
"""The 401 message each server family writes."""

REPLIES = {"nul": "a NUL \x00 here", "surrogate": "a lone \ud800 surrogate"}
"""Replies valid as JSON that Postgres cannot store, by marker."""


def error_body(flavour: str, status: int, message: str) -> dict[str, Any]:
    """An error body as each server family writes it (their documented or observed shapes)."""
    if flavour == "azure":
        return {"error": {"code": str(status), "message": message}}
    if flavour == "vllm":
        return {"object": "error", "message": message,
                "type": "BadRequestError" if status < 500 else "InternalServerError",
                "param": None, "code": status}
    if flavour == "ollama":
        return {"error": message}
    kind = _ERROR_TYPES.get(status, "server_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": str(status)}}


def valid_messages(body: Any) -> list[dict[str, str]] | None:
    """The body's messages when it has a string model and {role, content} strings, else None."""
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        return None
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in messages
    ):
        return None
    return messages


def completion(model: str, messages: list[dict[str, str]], raw: bytes,
               reply: str | None = None, max_tokens: int | None = None) -> dict[str, Any]:
    """A `chat.completion` whose reply echoes the messages, so tests can check the context;
    cut to `max_tokens` words (`finish_reason: length`) when it is longer."""
    if reply is None:
        reply = f"echo[{len(messages)}]: " + " | ".join(f"{m['role']}:{m['content']}" for m in messages)
    finish = "stop"
    if max_tokens is not None and len(reply.split()) > max_tokens:
        reply, finish = " ".join(reply.split()[:max_tokens]), "length"
    prompt_tokens = sum(len(m["content"].split()) for m in messages)
    completion_tokens = len(reply.split())
    return {
        "id": "fake-" + hashlib.sha256(raw).hexdigest()[:12],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": reply},
                     "finish_reason": finish}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


def stream_events(answer: dict[str, Any]) -> list[bytes]:
    """A completion as OpenAI's server-sent chunks: one per word, then one with `finish_reason`
    and `usage` (the `data: [DONE]` line is the sender's)."""
    base = {key: answer[key] for key in ("id", "created", "model")}
    words = answer["choices"][0]["message"]["content"].split(" ")
    chunks = [{**base, "object": "chat.completion.chunk",
               "choices": [{"index": 0, "delta": {"content": word if i == 0 else " " + word},
                            "finish_reason": None}]} for i, word in enumerate(words)]
    chunks.append({**base, "object": "chat.completion.chunk",
                   "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                   "usage": answer["usage"]})
    return [b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks]


def max_tokens_of(body: dict[str, Any]) -> int | None:
    """The request's `max_tokens` (or `max_completion_tokens`) when it is a positive integer."""
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
