"""A streamed chat answer: `chat.completion.chunk` server-sent events built from the job's
output deltas (the hub's `job.output_delta`), ending with `data: [DONE]`.

The text a client has been sent is never taken back. A retried attempt streams from its start
again: its text is passed on only once it goes past what was sent, and only while it agrees
with it; an attempt whose text differs ends the stream with an error event naming the job (a
retry of the request with the same Idempotency-Key then streams the new attempt from its start).
A route configured without `stream` sends no deltas: its answer comes as one chunk at the end.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.openai_wire import (
    Body,
    chat_chunk,
    error_body,
    job_answer,
    job_failure,
    usage_body,
)
from jobqueue.core.states import TERMINAL
from jobqueue.core.tokens import Caller
from service.events.model import OutputDelta
from service.events.subscription import Subscription, SubscriptionClosed
from service.openai.waits import read_answer

__all__ = ["DONE", "ChatStream", "Diverged", "StreamPlan", "TextTracker", "await_first", "frames",
           "sse"]

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keepalive\n\n"


def sse(body: Body) -> bytes:
    """One server-sent event carrying `body` as JSON."""
    return b"data: " + json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


class Diverged(Exception):
    """A new attempt's text disagrees with what the client was already sent."""


class TextTracker:
    """The job's text as it grows, attempt by attempt, and what of it the client was sent."""

    def __init__(self, attempt: int | None, text: str | None) -> None:
        self.sent = ""
        self._attempt = attempt
        self._text = text or ""

    def on_delta(self, delta: OutputDelta) -> None:
        """Applies a delta (by offset: a new attempt starts over at 0)."""
        if delta.attempt != self._attempt:
            if delta.offset != 0:
                return  # NOTE: an attempt seen from its middle: the final text covers it
            self._attempt, self._text = delta.attempt, ""
        if delta.offset <= len(self._text):
            self._text = self._text[:delta.offset] + delta.text

    @property
    def unsent(self) -> bool:
        """Whether the text holds something the client was not sent."""
        return len(self._text) > len(self.sent)

    def take(self, final: str | None = None) -> str:
        """The text past what was sent (now marked sent); `final` is the answer's whole text.

        Raises:
            Diverged: the text does not continue what was sent.
        """
        text = self._text if final is None else final
        if text.startswith(self.sent):
            new, self.sent = text[len(self.sent):], text
            return new
        if self.sent.startswith(text):
            return ""  # NOTE: a retried attempt catching up with what was sent
        raise Diverged


@dataclass(frozen=True)
class StreamPlan:
    """What a stream needs besides its job: the caller, how long it may run, and its options."""

    pool: ConnectionPool[DictConnection]
    caller: Caller
    include_usage: bool
    keepalive: float
    deadline: float


def _next(sub: Subscription, tracker: TextTracker, plan: StreamPlan, row: Body,
          timeout: float) -> tuple[Body, bool]:
    """Waits up to `timeout` for the job's next news; (its row, whether anything came)."""
    try:
        events = sub.wait(timeout)
    except SubscriptionClosed:
        # NOTE: dropped by the hub (too slow a client, or the hub stopping): read where it is.
        time.sleep(min(timeout, 0.5))
        return read_answer(plan.pool, plan.caller, row["job_id"]), True
    for event in events:
        if isinstance(event, OutputDelta):
            tracker.on_delta(event)
        elif event.to_state in TERMINAL:
            row = read_answer(plan.pool, plan.caller, row["job_id"])
    return row, bool(events)


def await_first(sub: Subscription, tracker: TextTracker, plan: StreamPlan, row: Body,
                seconds: float) -> Body:
    """Waits up to `seconds` for the first text or the job's end, before any byte is sent, so a
    job that fails first answers with its HTTP status (the SDK's typed exception)."""
    until = time.monotonic() + seconds
    while row["state"] not in TERMINAL and not tracker.unsent:
        left = until - time.monotonic()
        if left <= 0:
            break
        row, _ = _next(sub, tracker, plan, row, left)
    return row


def _ending(row: Body, tracker: TextTracker, include_usage: bool) -> Iterator[bytes]:
    answer = job_answer(row)
    if row["state"] != "succeeded":
        yield sse(job_failure(answer)[1])
        return
    new = tracker.take(answer.response_text or "")
    if new:
        yield sse(chat_chunk(answer, {"content": new}, include_usage=include_usage))
    yield sse(chat_chunk(answer, {}, answer.finish_reason, include_usage=include_usage))
    if include_usage:
        yield sse(chat_chunk(answer, None, include_usage=True,
                             usage=usage_body(answer.tokens_in, answer.tokens_out)))
    yield DONE


def frames(sub: Subscription, tracker: TextTracker, plan: StreamPlan, row: Body) -> Iterator[bytes]:
    """The stream's events: the role, the text as it grows, then the end (or an error event)."""
    answer = job_answer(row)
    usage = plan.include_usage
    yield sse(chat_chunk(answer, {"role": "assistant", "content": ""}, include_usage=usage))
    job = row["job_id"]
    try:
        while row["state"] not in TERMINAL:
            new = tracker.take()
            if new:
                yield sse(chat_chunk(answer, {"content": new}, include_usage=usage))
            left = plan.deadline - time.monotonic()
            if left <= 0:
                yield sse(error_body(
                    f"sa-core job {job} is still {row['state']}; the stream closed at its time "
                    "limit (SA_OPENAI_STREAM_MAX). Send the request again with the same "
                    "Idempotency-Key to follow it.", "api_error", "stream_time_limit"))
                return
            row, news = _next(sub, tracker, plan, row, min(plan.keepalive, left))
            if not news:
                yield KEEPALIVE
        yield from _ending(row, tracker, usage)
    except Diverged:
        yield sse(error_body(
            f"the provider call of sa-core job {job} was retried and its new answer differs from "
            "the text already sent; send the request again with the same Idempotency-Key to "
            "stream the new answer from its start.", "api_error", "stream_restarted"))


class ChatStream:
    """The response body: the frames, and a close() that always frees what the stream holds.

    NOTE: a WSGI server calls close() even when the client left before the body was read.
    """

    def __init__(self, body: Iterator[bytes], on_close: Callable[[], Any]) -> None:
        self._body = body
        self._on_close = on_close

    def __iter__(self) -> Iterator[bytes]:
        return self._body

    def close(self) -> None:
        """Frees the follow and the admission slot, then ends the frames."""
        self._on_close()
        close = getattr(self._body, "close", None)
        if close is not None:
            close()
