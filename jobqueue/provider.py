"""The OpenAI-compatible provider adapter: one pooled httpx client, explicit timeouts, typed failures."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from jobqueue import metrics
from jobqueue.policy import ErrorKind, classify_status, parse_retry_after

__all__ = ["Completion", "Provider", "ProviderFailure"]

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
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message[:_MESSAGE_LIMIT]
        self.http_status = http_status
        self.retry_after = retry_after
        self.latency_ms = latency_ms


class Provider:
    """Calls `{base_url}/chat/completions`; safe to share between threads."""

    def __init__(self, base_url: str, api_key: str, timeout: float, max_connections: int = 64):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            base_url=base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=min(10.0, timeout)),
            limits=httpx.Limits(max_connections=max_connections),
        )

    def close(self) -> None:
        """Closes pooled connections."""
        self._client.close()

    def complete(self, model: str, messages: list[dict[str, str]]) -> Completion:
        """Runs one chat completion and records its latency by outcome.

        Args:
            model: provider model name.
            messages: OpenAI chat messages, oldest first.

        Returns:
            The completion.

        Raises:
            ProviderFailure: any failure, with its error_kind.
        """
        started = time.monotonic()
        try:
            completion = self._call(model, messages)
        except ProviderFailure as failure:
            metrics.PROVIDER_REQUEST_SECONDS.labels(outcome=failure.kind.value).observe(
                time.monotonic() - started)
            raise
        metrics.PROVIDER_REQUEST_SECONDS.labels(outcome="ok").observe(time.monotonic() - started)
        return completion

    def _call(self, model: str, messages: list[dict[str, str]]) -> Completion:
        started = time.monotonic()
        try:
            response = self._client.post(
                "/chat/completions", json={"model": model, "messages": messages}
            )
        except httpx.TimeoutException as exc:
            raise ProviderFailure(
                ErrorKind.TIMEOUT, f"provider timed out: {type(exc).__name__}",
                latency_ms=_elapsed_ms(started),
            ) from exc
        except httpx.HTTPError as exc:
            raise ProviderFailure(
                ErrorKind.UNKNOWN, f"provider unreachable: {type(exc).__name__}: {exc}",
                latency_ms=_elapsed_ms(started),
            ) from exc
        latency_ms = _elapsed_ms(started)
        if not response.is_success:
            raise ProviderFailure(
                classify_status(response.status_code),
                f"provider answered {response.status_code}: {response.text}",
                http_status=response.status_code,
                retry_after=parse_retry_after(
                    response.headers.get("retry-after"), datetime.now(UTC)
                ),
                latency_ms=latency_ms,
            )
        return _parse(response, model, latency_ms)


def _elapsed_ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def _parse(response: httpx.Response, model: str, latency_ms: int) -> Completion:
    try:
        body: Any = response.json()
        content = body["choices"][0]["message"]["content"]
        if not isinstance(content, str):
            raise TypeError("message content is not a string")
        if "\x00" in content:
            # NOTE: Postgres text cannot hold NUL; storing it would fail the finalize.
            raise ValueError("message content contains a NUL character")
        usage = body.get("usage") or {}
    except (ValueError, LookupError, TypeError, AttributeError) as exc:
        raise ProviderFailure(
            ErrorKind.PARSE,
            f"unreadable provider response ({type(exc).__name__}): {response.text}",
            http_status=response.status_code,
            latency_ms=latency_ms,
        ) from exc
    return Completion(
        content=content,
        model=str(body.get("model") or model),
        tokens_in=usage.get("prompt_tokens"),
        tokens_out=usage.get("completion_tokens"),
        http_status=response.status_code,
        latency_ms=latency_ms,
        request_id=body.get("id"),
    )
