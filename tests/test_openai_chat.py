"""The OpenAI-compatible chat front door, driven by the official `openai` SDK over real HTTP
against the fake provider: plain and streamed answers, models, typed errors, the hold and the
re-attach by Idempotency-Key, and every bound a chat request controls."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import openai
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.chat import MAX_MESSAGES
from jobqueue.core.db import DictConnection
from jobqueue.core.routes import Route
from jobqueue.core.settings import Settings
from jobqueue.devtools.fake_provider import FakeProvider
from tests.helpers import WorkerHarness, fetch_all, fetch_one, serve_app, wait_for

JOB = "x-sa-job-id"


def _client(base: str, auth: dict[str, str], **kwargs: Any) -> openai.OpenAI:
    kwargs.setdefault("max_retries", 0)
    return openai.OpenAI(base_url=f"{base}/openai/v1",
                         api_key=auth["Authorization"].removeprefix("Bearer "), **kwargs)


@pytest.fixture
def base(settings: Settings, pool: ConnectionPool[DictConnection]) -> Iterator[str]:
    with serve_app(settings, pool) as url:
        yield url


def test_a_chat_completion_runs_as_a_job_with_the_messages_as_given(
        base: str, auth: dict[str, str], workers: WorkerHarness, fake: FakeProvider) -> None:
    workers.start(listen=True, poll_interval=600)
    messages: list[Any] = [{"role": "system", "content": "be brief"},
                           {"role": "user", "content": "hi"},
                           {"role": "assistant", "content": "hello", "refusal": None},
                           {"role": "user", "content": [{"type": "text", "text": "and "},
                                                        {"type": "text", "text": "you?"}]}]
    raw = _client(base, auth).chat.completions.with_raw_response.create(
        model="fake-model", messages=messages, temperature=0.5, max_tokens=50, seed=7,
        stop=["zzz"], presence_penalty=0.1)
    completion = raw.parse()
    job_id = raw.headers[JOB]
    assert completion.choices[0].message.content == (
        "echo[4]: system:be brief | user:hi | assistant:hello | user:and you?")
    assert completion.choices[0].finish_reason == "stop"
    assert completion.id == "chatcmpl-" + uuid.UUID(job_id).hex
    assert completion.object == "chat.completion" and completion.model == "fake-model"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (6, 10)
    sent = next(b for b in reversed(fake.received) if b["messages"][0]["content"] == "be brief")
    assert sent["messages"] == [{"role": "system", "content": "be brief"},
                                {"role": "user", "content": "hi"},
                                {"role": "assistant", "content": "hello"},
                                {"role": "user", "content": "and you?"}]
    assert {k: sent[k] for k in ("temperature", "max_tokens", "seed", "stop", "presence_penalty")} \
        == {"temperature": 0.5, "max_tokens": 50, "seed": 7, "stop": ["zzz"], "presence_penalty": 0.1}
    # NOTE: the job is an ordinary sa-core job: the API shows it, its prompt the last user text.
    job = httpx.get(f"{base}/sa-core/v1/jobs/{job_id}", headers=auth, timeout=10).json()
    prompt = httpx.get(f"{base}/sa-core/v1/prompts/{job['prompt_id']}", headers=auth,
                       timeout=10).json()
    assert job["state"] == "succeeded" and prompt["prompt"]["content"] == "and you?"


@pytest.fixture
def streamed(base_settings: Settings, fake: FakeProvider) -> Settings:
    return replace(base_settings, provider_url="", stream_interval=0.02,
                   provider_routes=(Route("streamed", fake.url, stream=True),))


def test_a_streamed_chat_sends_chunks_as_the_provider_streams_then_usage_and_done(
        streamed: Settings, pool: ConnectionPool[DictConnection], auth: dict[str, str]) -> None:
    workers = WorkerHarness(streamed, pool)
    words = " ".join(f"w{i}" for i in range(20))
    try:
        workers.start(listen=True, poll_interval=600)
        with serve_app(streamed, pool) as url:
            raw = _client(url, auth).chat.completions.with_raw_response.create(
                model="fake-model", stream=True, stream_options={"include_usage": True},
                messages=[{"role": "user", "content": f"{words} [fake:stream-gap=0.05]"}])
            chunks = list(raw.parse())
    finally:
        workers.stop_all()
    assert raw.headers["content-type"].startswith("text/event-stream") and raw.headers[JOB]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == f"echo[1]: user:{words} [fake:stream-gap=0.05]"
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    # NOTE: the text arrived in several pieces while the job ran, not as one at the end.
    assert len(content) >= 3
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == len(text.split())
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


def test_stream_true_on_a_route_that_does_not_stream_sends_the_answer_in_one_chunk(
        base: str, auth: dict[str, str], workers: WorkerHarness) -> None:
    workers.start(listen=True, poll_interval=600)
    stream = _client(base, auth).chat.completions.create(
        model="fake-model", stream=True, messages=[{"role": "user", "content": "one piece"}])
    chunks = list(stream)
    content = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert content == ["echo[1]: user:one piece"]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_provider_refusal_is_the_sdks_typed_exception_naming_the_job(
        base: str, auth: dict[str, str], workers: WorkerHarness,
        pool: ConnectionPool[DictConnection]) -> None:
    workers.start(listen=True, poll_interval=600)
    client = _client(base, auth)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="fake-model",
                                       messages=[{"role": "user", "content": "no [fake:400]"}])
    assert refused.value.code == "provider_4xx" and refused.value.type == "invalid_request_error"
    job_id = refused.value.response.headers[JOB]
    assert job_id in refused.value.message
    assert fetch_one(pool, "SELECT state, error_kind FROM sa_job WHERE id = %s", job_id) == {
        "state": "failed", "error_kind": "provider_4xx"}
    # NOTE: streamed, a job that fails before its first text answers with its status too.
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="fake-model", stream=True,
                                       messages=[{"role": "user", "content": "no [fake:400]"}])


def test_a_job_outliving_the_hold_answers_409_and_the_same_key_attaches_to_it(
        settings: Settings, pool: ConnectionPool[DictConnection], auth: dict[str, str],
        workers: WorkerHarness, fake: FakeProvider) -> None:
    held = replace(settings, openai_max_wait=1.0)
    workers.start(listen=True, poll_interval=600)
    text = f"slow {uuid.uuid4()} [fake:latency=2.5]"
    body: Any = {"model": "fake-model", "messages": [{"role": "user", "content": text}]}
    key = {"Idempotency-Key": str(uuid.uuid4())}
    served = fake.requests_served
    with serve_app(held, pool) as url:
        with pytest.raises(openai.ConflictError) as running:
            _client(url, auth).chat.completions.create(**body, extra_headers=key)
        first = running.value.response.headers
        assert running.value.code == "job_in_progress" and first["x-should-retry"] == "true"
        # NOTE: the SDK's own retries carry the key: they wait on the same job until it ends.
        patient = _client(url, auth, max_retries=5)
        raw = patient.chat.completions.with_raw_response.create(**body, extra_headers=key)
        assert raw.headers[JOB] == first[JOB]
        assert raw.headers["idempotent-replayed"] == "true"
        assert raw.parse().choices[0].message.content == f"echo[1]: user:{text}"
        # NOTE: without a key the SDK is told not to retry: a retry would pay for a new job.
        with pytest.raises(openai.ConflictError) as keyless:
            _client(url, auth, max_retries=3).chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": f"{text}!"}])
        assert keyless.value.response.headers["x-should-retry"] == "false"
    jobs = fetch_all(pool, "SELECT id FROM sa_job")
    assert len(jobs) == 2
    wait_for(lambda: fake.requests_served - served == 2, timeout=10)


def test_unsupported_fields_and_unknown_models_are_refused_and_queue_nothing(
        base: str, auth: dict[str, str], pool: ConnectionPool[DictConnection]) -> None:
    client = _client(base, auth)
    user = [{"role": "user", "content": "x"}]
    with pytest.raises(openai.BadRequestError) as tools:
        client.chat.completions.create(model="fake-model", messages=user,  # type: ignore[call-overload]
                                       tools=[{"type": "function", "function": {"name": "f"}}])
    assert (tools.value.param, tools.value.code) == ("tools", "unsupported_parameter")
    with pytest.raises(openai.BadRequestError) as many:
        client.chat.completions.create(model="fake-model", messages=user, n=2)
    assert many.value.param == "n"
    with pytest.raises(openai.BadRequestError) as role:
        client.chat.completions.create(model="fake-model", messages=[  # type: ignore[list-item]
            {"role": "tool", "content": "x", "tool_call_id": "c"}])
    assert role.value.param == "messages[0].role"
    with pytest.raises(openai.BadRequestError) as unknown:
        client.chat.completions.create(model="fake-model", messages=user,
                                       extra_body={"frobnicate": 1})
    assert unknown.value.code == "unknown_parameter"
    assert fetch_all(pool, "SELECT id FROM sa_job") == []


def test_models_lists_what_the_routes_serve(base: str, auth: dict[str, str]) -> None:
    client = _client(base, auth)
    assert [(m.id, m.owned_by) for m in client.models.list()] == [("fake-model", "default")]
    assert client.models.retrieve("fake-model").id == "fake-model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def test_an_unknown_model_is_a_404_and_a_bad_token_a_401_in_openais_shape(
        settings: Settings, pool: ConnectionPool[DictConnection], auth: dict[str, str],
        fake: FakeProvider) -> None:
    routed = replace(settings, provider_url="",
                     provider_routes=(Route("only", fake.url, models=("fake-model",)),))
    with serve_app(routed, pool) as url:
        with pytest.raises(openai.NotFoundError) as unknown:
            _client(url, auth).chat.completions.create(
                model="gpt-unknown", messages=[{"role": "user", "content": "x"}])
        assert unknown.value.code == "model_not_found"
        with pytest.raises(openai.AuthenticationError) as bad:
            _client(url, {"Authorization": "Bearer nope"}).models.list()
        assert bad.value.code == "invalid_api_key"
        answer = httpx.get(f"{url}/openai/v1/nothing-here", headers=auth, timeout=10)
    assert answer.status_code == 404 and set(answer.json()["error"]) == {
        "message", "type", "param", "code"}


def test_every_bound_of_a_chat_request_answers_in_openais_shape(
        settings: Settings, pool: ConnectionPool[DictConnection], auth: dict[str, str]) -> None:
    bounded = replace(settings, max_prompt_chars=50, max_body_bytes=200_000,
                      openai_max_waiting=1, openai_max_wait=1.0)
    with serve_app(bounded, pool) as url:
        client = _client(url, auth)
        with pytest.raises(openai.BadRequestError) as long_text:
            client.chat.completions.create(model="fake-model",
                                           messages=[{"role": "user", "content": "x" * 51}])
        assert long_text.value.code == "string_above_max_length"
        with pytest.raises(openai.BadRequestError) as many:
            client.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "x"}] * (MAX_MESSAGES + 1))
        assert many.value.param == "messages"
        with pytest.raises(openai.APIStatusError) as large:
            client.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "y"}] * 7_000)
        assert large.value.status_code == 413 and large.value.code == "request_too_large"
    assert fetch_all(pool, "SELECT id FROM sa_job") == []
