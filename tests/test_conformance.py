"""Conformance (issue 14, item 7): the provider adapter against the answers of OpenAI, Azure
OpenAI, vLLM and Ollama as the fake provider replays them over real HTTP: their error bodies,
Azure's deployment path, `api-version` and `api-key`, and OpenAI's streamed chunks."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from jobqueue.core.policy import ErrorKind
from jobqueue.devtools.fake_provider import FakeConfig, FakeProvider
from jobqueue.runtime.provider import Provider
from jobqueue.runtime.provider_answer import ProviderFailure

FLAVOURS = ("openai", "azure", "vllm", "ollama")
KEY = "sk-conformance"

# NOTE: the shapes each server family documents (or, for vLLM and Ollama, writes) for an error.
SHAPES: dict[str, Any] = {
    "openai": lambda b: set(b) == {"error"} and set(b["error"]) == {"message", "type", "param",
                                                                     "code"},
    "azure": lambda b: set(b) == {"error"} and set(b["error"]) == {"code", "message"},
    "vllm": lambda b: b["object"] == "error" and {"message", "type", "code"} <= set(b),
    "ollama": lambda b: set(b) == {"error"} and isinstance(b["error"], str),
}


@pytest.fixture(scope="module", params=FLAVOURS)
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, FakeProvider]]:
    flavour = request.param
    with FakeProvider(config=FakeConfig(api_key=KEY, flavour="openai" if flavour == "azure"
                                        else flavour)) as fake:
        yield flavour, fake


def _base(flavour: str, fake: FakeProvider) -> str:
    if flavour == "azure":
        return f"{fake.url}/openai/deployments/gpt4o?api-version=2024-06-01"
    return f"{fake.url}/v1"


def _client(flavour: str, fake: FakeProvider, key: str = KEY) -> Provider:
    headers = {"api-key": key} if flavour == "azure" else {"Authorization": f"Bearer {key}"}
    return Provider(_base(flavour, fake), "", 5.0, headers=headers)


def _fail(provider: Provider, text: str) -> ProviderFailure:
    with pytest.raises(ProviderFailure) as raised:
        provider.complete("m", [{"role": "user", "content": text}])
    return raised.value


@pytest.mark.parametrize(("status", "kind"), [
    (400, ErrorKind.PROVIDER_4XX), (404, ErrorKind.PROVIDER_4XX), (422, ErrorKind.PROVIDER_4XX),
    (500, ErrorKind.PROVIDER_5XX), (503, ErrorKind.PROVIDER_5XX),
])
def test_each_error_body_is_classified_and_its_message_kept(
        server: tuple[str, FakeProvider], status: int, kind: ErrorKind) -> None:
    flavour, fake = server
    provider = _client(flavour, fake)
    try:
        failure = _fail(provider, f"hi [fake:{status}]")
    finally:
        provider.close()
    assert (failure.kind, failure.http_status) == (kind, status)
    # NOTE: the provider's own sentence, not its JSON, goes into the job's error_message.
    assert failure.message == f"provider answered {status}: Fake failure {status}"


def test_a_rate_limit_keeps_its_retry_after(server: tuple[str, FakeProvider]) -> None:
    flavour, fake = server
    provider = _client(flavour, fake)
    try:
        with_header = _fail(provider, "hi [fake:429=7]")
        without = _fail(provider, "hi [fake:429-nohdr]")
    finally:
        provider.close()
    assert (with_header.kind, with_header.retry_after) == (ErrorKind.RATE_LIMIT, 7.0)
    assert (without.kind, without.retry_after) == (ErrorKind.RATE_LIMIT, None)
    assert with_header.message == "provider answered 429: Fake failure 429"


def test_a_wrong_key_is_an_auth_failure_in_the_servers_words(
        server: tuple[str, FakeProvider]) -> None:
    flavour, fake = server
    provider = _client(flavour, fake, key="sk-wrong")
    try:
        failure = _fail(provider, "hi")
    finally:
        provider.close()
    assert (failure.kind, failure.http_status) == (ErrorKind.AUTH, 401)
    expected = {"openai": "Incorrect API key provided.", "vllm": "Unauthorized",
                "ollama": "unauthorized", "azure": "Access denied due to invalid subscription key"}
    assert failure.message.startswith(f"provider answered 401: {expected[flavour]}")


def test_the_right_key_answers_plain_and_streamed(server: tuple[str, FakeProvider]) -> None:
    flavour, fake = server
    provider = _client(flavour, fake)
    pieces: list[str] = []
    try:
        plain = provider.complete("m", [{"role": "user", "content": "hi there"}])
        streamed = provider.complete("m", [{"role": "user", "content": "hi there"}],
                                     on_delta=pieces.append)
    finally:
        provider.close()
    assert plain.content == streamed.content == "echo[1]: user:hi there"
    assert len(pieces) == 3 and "".join(pieces) == streamed.content
    assert (streamed.tokens_in, streamed.tokens_out) == (plain.tokens_in, plain.tokens_out) == (2, 3)


def test_the_fakes_error_bodies_have_each_servers_shape(server: tuple[str, FakeProvider]) -> None:
    flavour, fake = server
    request = urllib.request.Request(
        _base(flavour, fake).replace("?", "/chat/completions?") if flavour == "azure"
        else f"{_base(flavour, fake)}/chat/completions", method="POST",
        data=json.dumps({"model": "m", "messages": [{"role": "user", "content": "[fake:500]"}]}
                        ).encode(), headers={"Content-Type": "application/json",
                                             "api-key": KEY, "Authorization": f"Bearer {KEY}"})
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request, timeout=5)
    assert SHAPES[flavour](json.loads(raised.value.read()))


def test_an_azure_deployment_without_api_version_is_not_found() -> None:
    with FakeProvider(config=FakeConfig(api_key=KEY)) as fake:
        provider = Provider(f"{fake.url}/openai/deployments/gpt4o", "", 5.0,
                            headers={"api-key": KEY})
        try:
            failure = _fail(provider, "hi")
        finally:
            provider.close()
    assert (failure.kind, failure.http_status) == (ErrorKind.PROVIDER_4XX, 404)
    assert failure.message == "provider answered 404: Resource not found"
