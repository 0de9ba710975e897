"""A Python client of the sa-core HTTP API, sync (`Client`) and asyncio (`AsyncClient`), over httpx.

    from sa_core.client import Client

    with Client("http://127.0.0.1:8000", token="sa_...") as sa:
        submitted = sa.submit("Hello, sa-core!", idempotency_key="greeting-1")
        result = sa.wait(submitted.job_id, timeout=60)
        print(result.job["state"], result.response_text)
        for event in sa.events():       # SSE with Last-Event-ID resume, else polling
            print(event.kind, event.data)

Errors come back as `ApiError` (with the answer's HTTP status, title and description); a job
that does not finish in time as `WaitTimeout`.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

import httpx

__all__ = [
    "API_PREFIX",
    "TERMINAL_STATES",
    "ApiError",
    "AsyncClient",
    "Client",
    "Event",
    "Result",
    "SseParser",
    "Submitted",
    "WaitTimeout",
]

API_PREFIX = "/sa-core/v1"

TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled", "superseded"})
"""Job states that never change again."""

# NOTE: statuses that say "this endpoint cannot stream to you here" (a proxy without the route,
# a stream cap): events() falls back to polling /mission/recent. 401/403 are the caller's to fix.
_NO_STREAM = frozenset({404, 405, 406, 429, 501, 502, 503, 504})
_STREAM_RETRY_SECONDS = 2.0
_POLL_MAX_SECONDS = 2.0

JsonObject = dict[str, Any]
IdLike = uuid.UUID | str


class ApiError(Exception):
    """The service answered an error: `status` is the HTTP status, `title` and `description` its body."""

    def __init__(self, status: int, title: str, description: str) -> None:
        super().__init__(f"{status} {title}: {description}")
        self.status = status
        self.title = title
        self.description = description


class WaitTimeout(TimeoutError):
    """The job did not reach a terminal state within the time `wait()` was given."""


@dataclass(frozen=True, slots=True)
class Submitted:
    """The answer to a submit: the ids, the job's state, and whether it replays an earlier submit."""

    prompt_id: str
    job_id: str
    state: str
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class Result:
    """A finished job and, when it succeeded, the response's text."""

    job: JsonObject
    response_text: str | None


@dataclass(frozen=True, slots=True)
class Event:
    """One item of `events()`.

    `kind` is `job.state_changed` for a Server-Sent Event (`data`: the transition, `id`: its event
    id, which resumes the stream) or `prompt.latest` when polling `/mission/recent` (`data`: the
    prompt with its latest job, `id`: the page's cursor, which resumes the polling).
    """

    kind: str
    data: JsonObject
    id: str | None = None


@dataclass
class SseParser:
    """Turns the lines of a `text/event-stream` into events (the WHATWG parsing rules we need).

    Comments (`: keepalive`) are skipped; `retry:` updates `retry_seconds`; the last `id:` seen is
    kept in `last_event_id`, for a reconnect's `Last-Event-ID`.
    """

    last_event_id: str | None = None
    retry_seconds: float = _STREAM_RETRY_SECONDS
    _event: str = ""
    _data: list[str] = field(default_factory=list)

    def feed(self, line: str) -> Event | None:
        """Takes one line (without its end of line); returns an event when the line completes one."""
        if line == "":
            if not self._data:
                self._event = ""
                return None
            event = Event(self._event or "message", json.loads("\n".join(self._data)), self.last_event_id)
            self._event, self._data = "", []
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self.last_event_id = value
        elif name == "retry" and value.isdigit():
            self.retry_seconds = int(value) / 1000
        return None


def _raise_for(response: httpx.Response) -> None:
    if response.is_success:
        return
    try:
        body = response.json()
        title, description = str(body.get("title", "")), str(body.get("description", ""))
    except ValueError:
        title, description = response.reason_phrase, response.text[:200]
    raise ApiError(response.status_code, title, description)


def _submit_request(text: str, options: Mapping[str, Any] | None, priority: int | None,
                    max_attempts: int | None, parent_id: IdLike | None,
                    idempotency_key: str | None) -> tuple[JsonObject, dict[str, str]]:
    body: JsonObject = {"text": text}
    for name, value in (("options", dict(options) if options is not None else None),
                        ("priority", priority), ("max_attempts", max_attempts),
                        ("parent_id", str(parent_id) if parent_id is not None else None)):
        if value is not None:
            body[name] = value
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else {}
    return body, headers


def _submitted(response: httpx.Response) -> Submitted:
    _raise_for(response)
    body = response.json()
    return Submitted(str(body["prompt_id"]), str(body["job_id"]), str(body["state"]),
                     response.headers.get("Idempotent-Replayed") == "true")


def _json(response: httpx.Response) -> JsonObject:
    _raise_for(response)
    body: JsonObject = response.json()
    return body


def _response_text(prompt: JsonObject) -> str | None:
    response = prompt.get("response")
    return str(response["content"]) if response else None


def _stream_params(scope: Literal["user", "org"]) -> dict[str, str]:
    return {"scope": "org"} if scope == "org" else {}


def _page_params(cursor: str | None, since: str | None, scope: Literal["user", "org"],
                 limit: int) -> dict[str, str]:
    params = {**_stream_params(scope), "limit": str(limit)}
    if cursor is not None:
        params["cursor"] = cursor
    elif since is not None:
        params["since"] = since
    return params


def _headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Accept": "application/json"}


class Client:
    """Synchronous client; use it as a context manager (or call `close()`).

    Args:
        base_url: the service's root, e.g. `http://127.0.0.1:8000`.
        token: an API token (`sa-core create-token`).
        timeout: seconds per request (a stream's read timeout is `stream_timeout`).
        stream_timeout: seconds a stream may stay silent; the server sends a keepalive every 15 s.
        http: an httpx.Client to use instead of a new one (its base URL and headers are kept).
    """

    def __init__(self, base_url: str, token: str, *, timeout: float = 10.0,
                 stream_timeout: float = 45.0, http: httpx.Client | None = None) -> None:
        self._http = http or httpx.Client(base_url=base_url.rstrip("/"), headers=_headers(token),
                                          timeout=timeout)
        self._stream_timeout = stream_timeout

    def __enter__(self) -> Client:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connections."""
        self._http.close()

    def submit(self, text: str, *, options: Mapping[str, Any] | None = None, priority: int | None = None,
               max_attempts: int | None = None, parent_id: IdLike | None = None,
               idempotency_key: str | None = None) -> Submitted:
        """Submits a prompt (POST /prompt); the same `idempotency_key` within 24 h returns the first ids.

        Raises:
            ApiError: refused (400 invalid, 422 key reused with another body, 429 queue full, ...).
        """
        body, headers = _submit_request(text, options, priority, max_attempts, parent_id, idempotency_key)
        return _submitted(self._http.post(f"{API_PREFIX}/prompt", json=body, headers=headers))

    def job(self, job_id: IdLike) -> JsonObject:
        """Returns the job (GET /jobs/{id}). Raises ApiError 404 when it is not your org's."""
        return _json(self._http.get(f"{API_PREFIX}/jobs/{job_id}"))

    def prompt(self, prompt_id: IdLike) -> JsonObject:
        """Returns `{prompt, response, jobs}` (GET /prompts/{id})."""
        return _json(self._http.get(f"{API_PREFIX}/prompts/{prompt_id}"))

    def cancel(self, job_id: IdLike) -> JsonObject:
        """Cancels a queued or running job. Raises ApiError 409 when it already finished."""
        return _json(self._http.post(f"{API_PREFIX}/jobs/{job_id}/cancel"))

    def retry(self, prompt_id: IdLike) -> JsonObject:
        """Queues a new job for a prompt whose latest job finished; returns its ids."""
        return _json(self._http.post(f"{API_PREFIX}/prompts/{prompt_id}/retry"))

    def wait(self, job_id: IdLike, *, timeout: float = 300.0, poll_interval: float = 0.2) -> Result:
        """Returns once the job is terminal, with the response's text when it succeeded.

        Polls the job, the interval doubling from `poll_interval` up to 2 s (the API has no
        long-poll yet).

        Raises:
            WaitTimeout: still not terminal after `timeout` seconds.
        """
        deadline = time.monotonic() + timeout
        interval = poll_interval
        while True:
            job = self.job(job_id)
            if job["state"] in TERMINAL_STATES:
                text = _response_text(self.prompt(job["prompt_id"])) if job["state"] == "succeeded" else None
                return Result(job, text)
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(f"job {job_id} is still {job['state']} after {timeout:g}s")
            time.sleep(min(interval, left))
            interval = min(interval * 2, _POLL_MAX_SECONDS)

    def events(self, *, last_event_id: str | None = None, scope: Literal["user", "org"] = "user",
               poll: bool = False, poll_interval: float = 1.0, since: str | None = None) -> Iterator[Event]:
        """Follows your jobs' transitions, forever (break out of the loop to stop).

        Reads the SSE stream (GET /mission/events) and reconnects with `Last-Event-ID`, so no
        event is missed or repeated across a reconnect. When the stream is unavailable (the route
        is missing behind a proxy, too many streams are open, or `poll=True`), polls
        `/mission/recent` instead, paging with its `cursor`/`next_cursor`.

        Args:
            last_event_id: resume the stream after this event id.
            scope: "org" for every job of your org (needs an org-wide token), else your own.
            poll: poll from the start.
            poll_interval: seconds between polls once a page is not full.
            since: polling's first page starts at this ISO 8601 instant (else the whole log).
        """
        if not poll:
            parser = SseParser(last_event_id=last_event_id)
            while True:
                headers = {"Accept": "text/event-stream"}
                if parser.last_event_id is not None:
                    headers["Last-Event-ID"] = parser.last_event_id
                try:
                    with self._http.stream("GET", f"{API_PREFIX}/mission/events", headers=headers,
                                           params=_stream_params(scope),
                                           timeout=httpx.Timeout(10.0, read=self._stream_timeout)) as resp:
                        if resp.status_code in _NO_STREAM:
                            break
                        if not resp.is_success:
                            resp.read()
                            _raise_for(resp)
                        for line in resp.iter_lines():
                            if (event := parser.feed(line)) is not None:
                                yield event
                except (httpx.TransportError, httpx.RemoteProtocolError):
                    pass
                time.sleep(parser.retry_seconds)
        cursor: str | None = None
        while True:
            page = _json(self._http.get(f"{API_PREFIX}/mission/recent",
                                        params=_page_params(cursor, since, scope, 100)))
            cursor = str(page["next_cursor"])
            for item in page["items"]:
                yield Event("prompt.latest", item, cursor)
            if not page["has_more"]:
                time.sleep(poll_interval)


class AsyncClient:
    """The asyncio twin of `Client`: the same methods, awaited; `events()` is an async iterator."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 10.0,
                 stream_timeout: float = 45.0, http: httpx.AsyncClient | None = None) -> None:
        self._http = http or httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=_headers(token),
                                               timeout=timeout)
        self._stream_timeout = stream_timeout

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, value: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the connections."""
        await self._http.aclose()

    async def submit(self, text: str, *, options: Mapping[str, Any] | None = None,
                     priority: int | None = None, max_attempts: int | None = None,
                     parent_id: IdLike | None = None, idempotency_key: str | None = None) -> Submitted:
        """See `Client.submit`."""
        body, headers = _submit_request(text, options, priority, max_attempts, parent_id, idempotency_key)
        return _submitted(await self._http.post(f"{API_PREFIX}/prompt", json=body, headers=headers))

    async def job(self, job_id: IdLike) -> JsonObject:
        """See `Client.job`."""
        return _json(await self._http.get(f"{API_PREFIX}/jobs/{job_id}"))

    async def prompt(self, prompt_id: IdLike) -> JsonObject:
        """See `Client.prompt`."""
        return _json(await self._http.get(f"{API_PREFIX}/prompts/{prompt_id}"))

    async def cancel(self, job_id: IdLike) -> JsonObject:
        """See `Client.cancel`."""
        return _json(await self._http.post(f"{API_PREFIX}/jobs/{job_id}/cancel"))

    async def retry(self, prompt_id: IdLike) -> JsonObject:
        """See `Client.retry`."""
        return _json(await self._http.post(f"{API_PREFIX}/prompts/{prompt_id}/retry"))

    async def wait(self, job_id: IdLike, *, timeout: float = 300.0, poll_interval: float = 0.2) -> Result:
        """See `Client.wait`."""
        deadline = time.monotonic() + timeout
        interval = poll_interval
        while True:
            job = await self.job(job_id)
            if job["state"] in TERMINAL_STATES:
                prompt = await self.prompt(job["prompt_id"]) if job["state"] == "succeeded" else None
                return Result(job, _response_text(prompt) if prompt else None)
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(f"job {job_id} is still {job['state']} after {timeout:g}s")
            await asyncio.sleep(min(interval, left))
            interval = min(interval * 2, _POLL_MAX_SECONDS)

    async def events(self, *, last_event_id: str | None = None, scope: Literal["user", "org"] = "user",
                     poll: bool = False, poll_interval: float = 1.0,
                     since: str | None = None) -> AsyncIterator[Event]:
        """See `Client.events`."""
        if not poll:
            parser = SseParser(last_event_id=last_event_id)
            while True:
                headers = {"Accept": "text/event-stream"}
                if parser.last_event_id is not None:
                    headers["Last-Event-ID"] = parser.last_event_id
                try:
                    async with self._http.stream(
                            "GET", f"{API_PREFIX}/mission/events", headers=headers,
                            params=_stream_params(scope),
                            timeout=httpx.Timeout(10.0, read=self._stream_timeout)) as resp:
                        if resp.status_code in _NO_STREAM:
                            break
                        if not resp.is_success:
                            await resp.aread()
                            _raise_for(resp)
                        async for line in resp.aiter_lines():
                            if (event := parser.feed(line)) is not None:
                                yield event
                except (httpx.TransportError, httpx.RemoteProtocolError):
                    pass
                await asyncio.sleep(parser.retry_seconds)
        cursor: str | None = None
        while True:
            page = _json(await self._http.get(f"{API_PREFIX}/mission/recent",
                                              params=_page_params(cursor, since, scope, 100)))
            cursor = str(page["next_cursor"])
            for item in page["items"]:
                yield Event("prompt.latest", item, cursor)
            if not page["has_more"]:
                await asyncio.sleep(poll_interval)
