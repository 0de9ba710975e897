"""OpenAI's answer shapes, built from sa-core's jobs: ids, chat.completion, chat.completion.chunk,
the error body a failed job answers with, and the lines of a batch's output and error files.

Pure: the chat route (service/openai/) and the batch's file writer (jobqueue/engine/batch_output.py)
build the same bodies from the same job, so a batch line holds exactly what the chat route
would have answered.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["BATCH_ID_PREFIX", "CHAT_ID_PREFIX", "FILE_ID_PREFIX", "JobAnswer", "batch_line",
           "chat_chunk", "chat_completion", "error_body", "job_answer", "job_failure", "object_id",
           "parse_object_id", "unix", "usage_body"]

CHAT_ID_PREFIX = "chatcmpl-"
FILE_ID_PREFIX = "file-"
BATCH_ID_PREFIX = "batch_"
BATCH_REQUEST_PREFIX = "batch_req_"

Body = dict[str, Any]


def object_id(prefix: str, value: uuid.UUID) -> str:
    """An OpenAI-style id: the prefix and the row's uuid in 32 hex digits."""
    return prefix + value.hex


def parse_object_id(prefix: str, text: str) -> uuid.UUID | None:
    """The uuid behind an id of `object_id`'s form; None for anything else (answered 404)."""
    if not text.startswith(prefix):
        return None
    digits = text[len(prefix):]
    if len(digits) != 32 or any(c not in "0123456789abcdef" for c in digits):
        return None
    return uuid.UUID(hex=digits)


def unix(moment: datetime | None) -> int | None:
    """Seconds since the epoch, as OpenAI's timestamps are."""
    return None if moment is None else int(moment.timestamp())


def error_body(message: str, type_: str, code: str | None = None,
               param: str | None = None) -> Body:
    """OpenAI's error body."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def usage_body(tokens_in: int | None, tokens_out: int | None) -> Body:
    """OpenAI's `usage` (a provider that reported no count counts 0)."""
    prompt, completion = tokens_in or 0, tokens_out or 0
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


@dataclass(frozen=True)
class JobAnswer:
    """What a chat answer is built from: a job and, when it succeeded, its response and usage."""

    job_id: uuid.UUID
    created_at: datetime
    state: str
    model: str
    max_tokens: int | None
    response_text: str | None
    tokens_in: int | None
    tokens_out: int | None
    error_kind: str | None
    error_message: str | None

    @property
    def chat_id(self) -> str:
        """The completion's id: the job's, so an answer names its job."""
        return object_id(CHAT_ID_PREFIX, self.job_id)

    @property
    def finish_reason(self) -> str:
        """`length` when the answer used the whole `max_tokens`, else `stop`.

        NOTE: the provider's own finish_reason is not stored; the token count tells the one
        case a client acts on (a cut answer).
        """
        cut = self.max_tokens is not None and (self.tokens_out or 0) >= self.max_tokens
        return "length" if cut else "stop"


def chat_completion(answer: JobAnswer) -> Body:
    """The `chat.completion` of a succeeded job."""
    return {
        "id": answer.chat_id, "object": "chat.completion", "created": unix(answer.created_at),
        "model": answer.model,
        "choices": [{"index": 0, "message": {"role": "assistant",
                                             "content": answer.response_text or "",
                                             "refusal": None},
                     "logprobs": None, "finish_reason": answer.finish_reason}],
        "usage": usage_body(answer.tokens_in, answer.tokens_out),
        "system_fingerprint": None,
    }


def chat_chunk(answer: JobAnswer, delta: Body | None, finish_reason: str | None = None, *,
               include_usage: bool = False, usage: Body | None = None) -> Body:
    """One `chat.completion.chunk`; `delta` None makes the usage chunk (no choices).

    With `include_usage`, every chunk carries `usage`: null but the last, which has it.
    """
    chunk: Body = {"id": answer.chat_id, "object": "chat.completion.chunk",
                   "created": unix(answer.created_at), "model": answer.model,
                   "system_fingerprint": None,
                   "choices": [] if delta is None else [
                       {"index": 0, "delta": delta, "logprobs": None,
                        "finish_reason": finish_reason}]}
    if include_usage:
        chunk["usage"] = usage
    return chunk


# NOTE: a failed job's answer. The attempts are sa-core's own (retried with backoff inside the
# job), so a client is told not to retry the same request; a provider's refusal of the request
# is the client's 400, a provider that stays throttled a 429, and a provider that failed after
# every attempt a 502 (a gateway's answer for a failed upstream: sa-core itself did not fail).
_FAILURES: dict[str, tuple[int, str]] = {
    "provider_4xx": (400, "invalid_request_error"),
    "invalid_options": (400, "invalid_request_error"),
    "rate_limit": (429, "rate_limit_error"),
    "auth": (502, "api_error"),
    "timeout": (502, "api_error"),
    "provider_5xx": (502, "api_error"),
    "parse": (502, "api_error"),
    "worker_crash": (502, "api_error"),
    "stuck": (502, "api_error"),
    "unknown": (502, "api_error"),
}


def job_failure(answer: JobAnswer) -> tuple[int, Body]:
    """The HTTP status and OpenAI error body of a job that ended without succeeding.

    A cancelled (or superseded) job answers 409 `job_cancelled`; a failed one by its error_kind
    (the code), with the job's error message.
    """
    job = answer.job_id
    if answer.state in ("cancelled", "superseded"):
        return 409, error_body(f"job {job} was {answer.state} before it finished"
                               + (f": {answer.error_message}" if answer.error_message else ""),
                               "invalid_request_error", f"job_{answer.state}")
    kind = answer.error_kind or "unknown"
    status, type_ = _FAILURES.get(kind, (502, "api_error"))
    message = answer.error_message or f"job {job} failed ({kind})"
    return status, error_body(f"{message} (sa-core job {job})", type_, kind)


def batch_line(custom_id: str | None, request_key: uuid.UUID, *, status: int | None = None,
               body: Body | None = None, code: str | None = None,
               message: str | None = None) -> Body:
    """One line of a batch's output or error file.

    With `status`, the request ran: `response` holds its status and body (a chat.completion, or
    the error body the chat route would answer). Without, it never ran: `error` says why
    (`code` and `message`).
    """
    line_id = object_id(BATCH_REQUEST_PREFIX, request_key)
    if status is None:
        return {"id": line_id, "custom_id": custom_id, "response": None,
                "error": {"code": code, "message": message}}
    return {"id": line_id, "custom_id": custom_id,
            "response": {"status_code": status, "request_id": line_id, "body": body},
            "error": None}


def job_answer(row: Body) -> JobAnswer:
    """A JobAnswer from a row of queries/answer.py's ANSWER_COLUMNS."""
    options = row["execution_options"] if isinstance(row["execution_options"], dict) else {}
    max_tokens = options.get("max_tokens")
    return JobAnswer(
        job_id=row["job_id"], created_at=row["created_at"], state=row["state"],
        model=str(row["used_model"] or options.get("model") or ""),
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
        response_text=row["response_text"], tokens_in=row["tokens_in"],
        tokens_out=row["tokens_out"], error_kind=row["error_kind"],
        error_message=row["error_message"])
