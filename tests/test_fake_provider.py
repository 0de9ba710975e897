"""Tests for the OpenAI-compatible fake provider over real HTTP."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from jobqueue.devtools.fake_provider import FakeConfig, FakeProvider, add_arguments, config_from_args

__all__: list[str] = []


@pytest.fixture()
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as fake:
        yield fake


@pytest.fixture()
def client(provider: FakeProvider) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=provider.url, timeout=5.0) as http:
        yield http


def _chat(client: httpx.Client, text: str, *, path: str = "/chat/completions") -> httpx.Response:
    body: dict[str, Any] = {"model": "fake-1", "messages": [{"role": "user", "content": text}]}
    return client.post(path, json=body)


def _assert_error(response: httpx.Response, status: int) -> None:
    assert response.status_code == status
    assert response.json()["error"]["code"] == str(status)


def test_echo_reply_and_usage(client: httpx.Client) -> None:
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": "hello there world"}]
    response = client.post("/chat/completions", json={"model": "m-7", "messages": messages})
    assert response.status_code == 200
    data = response.json()
    reply = "echo[2]: system:be brief | user:hello there world"
    assert data["choices"][0]["message"] == {"role": "assistant", "content": reply}
    assert data["choices"][0]["finish_reason"] == "stop"
    assert data["object"] == "chat.completion"
    assert data["model"] == "m-7"
    assert data["id"].startswith("fake-")
    assert data["usage"] == {"prompt_tokens": 5, "completion_tokens": len(reply.split()),
                             "total_tokens": 5 + len(reply.split())}


def test_v1_path_and_deterministic_id(client: httpx.Client) -> None:
    first = _chat(client, "same", path="/v1/chat/completions").json()
    second = _chat(client, "same").json()
    assert first["id"] == second["id"]
    assert first["choices"][0]["message"]["content"] == "echo[1]: user:same"


def test_rate_limited_with_and_without_retry_after(client: httpx.Client) -> None:
    default = _chat(client, "slow down [fake:429]")
    _assert_error(default, 429)
    assert default.headers["Retry-After"] == "1"
    assert default.json()["error"]["type"] == "rate_limit_error"
    assert _chat(client, "[fake:429=0.2] x").headers["Retry-After"] == "0.2"
    bare = _chat(client, "x [fake:429-nohdr]")
    _assert_error(bare, 429)
    assert "Retry-After" not in bare.headers


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422, 500, 503])
def test_status_markers(client: httpx.Client, status: int) -> None:
    _assert_error(_chat(client, f"please [fake:{status}] now"), status)


def test_unknown_marker_is_ignored(client: httpx.Client) -> None:
    assert _chat(client, "[fake:418] [fake:bogus]").status_code == 200


def test_only_last_user_message_carries_markers(client: httpx.Client) -> None:
    messages = [{"role": "user", "content": "[fake:500]"}, {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "fine"}, {"role": "assistant", "content": "[fake:500]"}]
    response = client.post("/chat/completions", json={"model": "m", "messages": messages})
    assert response.status_code == 200


def test_malformed_body_is_not_json(client: httpx.Client) -> None:
    response = _chat(client, "[fake:malformed]")
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/json"
    with pytest.raises(json.JSONDecodeError):
        json.loads(response.text)


def test_empty_has_no_choices(client: httpx.Client) -> None:
    response = _chat(client, "[fake:empty]")
    assert response.status_code == 200
    assert "choices" not in response.json()


def test_flaky_fails_then_succeeds(client: httpx.Client) -> None:
    statuses = [_chat(client, "retry me [fake:flaky=2]").status_code for _ in range(3)]
    assert statuses == [503, 503, 200]
    assert _chat(client, "other text [fake:flaky=1]").status_code == 503


def test_latency_marker_delays_answer(client: httpx.Client) -> None:
    started = time.monotonic()
    assert _chat(client, "[fake:latency=0.2]").status_code == 200
    assert time.monotonic() - started >= 0.2


def test_hang_released_by_client_timeout_and_stop_is_prompt() -> None:
    fake = FakeProvider().start()
    try:
        timeout = httpx.Timeout(5.0, read=0.3)
        with httpx.Client(base_url=fake.url, timeout=timeout) as http:
            with pytest.raises(httpx.ReadTimeout):
                _chat(http, "[fake:hang]")
            # NOTE: a second hang stays open on a live connection while stop() runs.
            with pytest.raises(httpx.ReadTimeout):
                _chat(http, "again [fake:hang]")
    finally:
        started = time.monotonic()
        fake.stop()
        assert time.monotonic() - started < 1.0


def test_stop_is_prompt_with_idle_keepalive_connection() -> None:
    fake = FakeProvider().start()
    with httpx.Client(base_url=fake.url, timeout=5.0) as http:
        assert http.get("/healthz").json() == {"ok": True}
        started = time.monotonic()
        fake.stop()
        assert time.monotonic() - started < 1.0


@pytest.mark.parametrize("content", [b"not json", b'{"model": "m"}', b'{"messages": []}',
                                     b'{"model": "m", "messages": [{"role": "user"}]}', b"[]"])
def test_bad_request_bodies_answer_400(client: httpx.Client, content: bytes) -> None:
    response = client.post("/chat/completions", content=content,
                           headers={"Content-Type": "application/json"})
    _assert_error(response, 400)


def test_received_and_counter(provider: FakeProvider, client: httpx.Client) -> None:
    messages = [{"role": "system", "content": "ctx"}, {"role": "user", "content": "q"}]
    client.post("/chat/completions", json={"model": "gpt-x", "messages": messages})
    _chat(client, "[fake:500]")
    assert provider.requests_served == 2
    assert provider.received[0] == {"model": "gpt-x", "messages": messages}
    assert provider.received[1]["messages"][0]["content"] == "[fake:500]"
    provider.received.clear()  # NOTE: a copy; the server's record is unaffected.
    assert len(provider.received) == 2


def test_healthz_and_unknown_paths(client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"ok": True}
    _assert_error(client.get("/nope"), 404)
    _assert_error(client.post("/completions", json={}), 404)


@pytest.mark.parametrize(("config", "status"), [
    (FakeConfig(fail_rate=1.0), 500), (FakeConfig(rate_limit_rate=1.0), 429),
])
def test_server_wide_rates(config: FakeConfig, status: int) -> None:
    with FakeProvider(config=config) as fake, httpx.Client(base_url=fake.url) as http:
        _assert_error(_chat(http, "hi"), status)
        # NOTE: a per-request marker overrides the random draw.
        assert _chat(http, "[fake:401]").status_code == 401


def test_config_validation_and_cli_arguments() -> None:
    with pytest.raises(ValueError):
        FakeConfig(fail_rate=1.5)
    with pytest.raises(ValueError):
        FakeConfig(latency=-1.0)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--latency", "0.5", "--fail-rate", "0.1", "--seed", "7",
                              "--verbose"])
    assert (args.host, args.port) == ("127.0.0.1", 8090)
    assert config_from_args(args) == FakeConfig(latency=0.5, fail_rate=0.1, seed=7, verbose=True)
    with pytest.raises(SystemExit):
        parser.parse_args(["--hang-rate", "2"])


def test_every_marker_and_option_is_in_the_fake_providers_page() -> None:
    # NOTE: the markers' module docstring sits beside the code that parses them; the page is
    # what a newcomer reads (docs/fake-provider.md), so it may not fall behind.
    import re
    from pathlib import Path

    from jobqueue.devtools import fake_markers

    page = (Path(__file__).resolve().parent.parent / "docs" / "fake-provider.md").read_text()
    markers = set(re.findall(r"\[fake:([a-z0-9-]+)", fake_markers.__doc__ or ""))
    assert {"latency", "hang", "429", "flaky", "stream-cut"} <= markers
    assert sorted(m for m in markers if f"[fake:{m}" not in page) == []
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    options = {flag for action in parser._actions for flag in action.option_strings
               if flag.startswith("--") and flag not in ("--help", "--host", "--port")}
    assert sorted(o for o in options if f"`{o}" not in page) == []
