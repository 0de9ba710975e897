"""Every bound of the front door that docs/limits.md lists, each past its limit, answered in
OpenAI's shape through the SDK (or raw HTTP where the SDK cannot misbehave), writing nothing."""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import replace
from typing import Any

import httpx
import openai
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from tests.helpers import WorkerHarness, fetch_all, running_keeper, serve_app, wait_for


def _client(base: str, auth: dict[str, str]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/openai/v1", max_retries=0,
                         api_key=auth["Authorization"].removeprefix("Bearer "))


def _line(custom_id: str, text: str) -> bytes:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "fake-model",
                                "messages": [{"role": "user", "content": text}]}}).encode() + b"\n"


def test_uploads_past_their_bounds_are_refused_and_keep_nothing(
        settings: Settings, pool: ConnectionPool[DictConnection], auth: dict[str, str]) -> None:
    bounded = replace(settings, file_max_bytes=4000, file_max_requests=3,
                      org_max_file_bytes=5000)
    with serve_app(bounded, pool) as url:
        client = _client(url, auth)
        with pytest.raises(openai.APIStatusError) as large:
            client.files.create(file=("big.jsonl", _line("a", "x" * 5000)), purpose="batch")
        assert (large.value.status_code, large.value.code) == (413, "file_too_large")
        with pytest.raises(openai.APIStatusError) as many:
            client.files.create(file=("many.jsonl", b"".join(_line(str(n), "x") for n in range(4))),
                                purpose="batch")
        assert many.value.status_code == 413 and "requests" in many.value.message
        client.files.create(file=("ok.jsonl", _line("a", "y" * 3000)), purpose="batch")
        with pytest.raises(openai.APIStatusError) as storage:
            client.files.create(file=("more.jsonl", _line("b", "z" * 2500)), purpose="batch")
        assert storage.value.status_code == 413 and "organization" in storage.value.message
        with pytest.raises(openai.BadRequestError) as purpose:
            client.files.create(file=("x.jsonl", _line("a", "x")), purpose="fine-tune")
        assert purpose.value.param == "purpose"
        # NOTE: the file before its purpose: refused (fields come first, as the SDK sends them).
        reversed_form = httpx.post(f"{url}/openai/v1/files", headers=auth, timeout=10, files=[
            ("file", ("x.jsonl", _line("a", "x"))), ("purpose", (None, b"batch"))])
        assert reversed_form.status_code == 400
        assert reversed_form.json()["error"]["param"] == "purpose"
        with pytest.raises(openai.BadRequestError):
            client.files.create(file=("empty.jsonl", b""), purpose="batch")
    assert [r["filename"] for r in fetch_all(pool, "SELECT filename FROM sa_file")] == ["ok.jsonl"]


def test_uploads_at_once_are_capped_per_process(
        settings: Settings, pool: ConnectionPool[DictConnection], auth: dict[str, str]) -> None:
    with serve_app(replace(settings, file_max_uploads=1), pool) as url:
        port = int(url.rsplit(":", 1)[1])
        boundary = "sa-core-test"
        head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
                f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
                f"filename=\"slow.jsonl\"\r\n\r\n").encode() + _line("a", "x" * 200_000)
        held = socket.create_connection(("127.0.0.1", port), timeout=10)
        held.sendall((f"POST /openai/v1/files HTTP/1.1\r\nHost: x\r\n{_header(auth)}"
                      f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
                      f"Content-Length: {len(head) + 10_000}\r\n\r\n").encode() + head)
        # NOTE: the upload has begun once its file row exists; the rest of its body never comes.
        wait_for(lambda: fetch_all(pool, "SELECT id FROM sa_file"))
        with pytest.raises(openai.RateLimitError) as busy:
            _client(url, auth).files.create(file=("b.jsonl", _line("b", "y")), purpose="batch")
        assert busy.value.code == "too_many_uploads"
        # NOTE: the held upload is cut short: it leaves nothing behind.
        held.close()
        wait_for(lambda: not fetch_all(pool, "SELECT id FROM sa_file"))


def _header(auth: dict[str, str]) -> str:
    return "".join(f"{k}: {v}\r\n" for k, v in auth.items())


def test_batch_requests_past_their_bounds_are_refused(
        settings: Settings, pool: ConnectionPool[DictConnection], auth: dict[str, str]) -> None:
    with serve_app(replace(settings, org_max_active_batches=1), pool) as url:
        client = _client(url, auth)
        input_id = client.files.create(file=("a.jsonl", _line("a", "x")), purpose="batch").id
        create: dict[str, Any] = {"input_file_id": input_id, "endpoint": "/v1/chat/completions",
                                  "completion_window": "24h"}
        with pytest.raises(openai.BadRequestError) as metadata:
            client.batches.create(**create, metadata={str(n): "v" for n in range(17)})
        assert metadata.value.param == "metadata"
        with pytest.raises(openai.BadRequestError) as window:
            client.batches.create(**{**create, "completion_window": "1h"})  # type: ignore[arg-type]
        assert window.value.param == "completion_window"
        client.batches.create(**create)
        with pytest.raises(openai.RateLimitError):
            client.batches.create(**create)
        with pytest.raises(openai.BadRequestError) as limit:
            client.batches.list(limit=101)
        assert limit.value.param == "limit"
        with pytest.raises(openai.BadRequestError):
            client.files.list(limit=10_001)
    assert len(fetch_all(pool, "SELECT id FROM sa_batch")) == 1


def test_a_line_longer_than_a_request_may_be_goes_to_the_error_file(
        settings: Settings, pool: ConnectionPool[DictConnection], auth: dict[str, str],
        workers: WorkerHarness) -> None:
    bounded = replace(settings, max_body_bytes=2000, batch_interval=0.05)
    workers.start(listen=True, poll_interval=600)
    with serve_app(bounded, pool) as url, running_keeper(bounded, pool):
        client = _client(url, auth)
        data = _line("short", "x") + _line("long", "y" * 3000) + _line("after", "z")
        batch = client.batches.create(
            input_file_id=client.files.create(file=("a.jsonl", data), purpose="batch").id,
            endpoint="/v1/chat/completions", completion_window="24h")
        done = wait_for(lambda: (b := client.batches.retrieve(batch.id)).status == "completed"
                        and b, timeout=30)
        errors = [json.loads(line) for line in
                  client.files.content(str(done.error_file_id)).read().splitlines()]
    assert done.request_counts is not None and done.request_counts.completed == 2
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [(None, "line_too_long")]


def test_held_chat_requests_are_capped_and_a_stream_ends_at_its_time_limit(
        settings: Settings, pool: ConnectionPool[DictConnection], auth: dict[str, str]) -> None:
    capped = replace(settings, openai_max_waiting=1, openai_max_wait=2.0, openai_stream_max=1.0)
    body: Any = {"model": "fake-model", "messages": [{"role": "user", "content": "nobody runs me"}]}
    with serve_app(capped, pool) as url:
        client = _client(url, auth)
        outcome: list[type[BaseException]] = []

        def hold() -> None:
            try:
                client.chat.completions.create(**body)
            except openai.APIStatusError as exc:
                outcome.append(type(exc))

        holder = threading.Thread(target=hold)
        holder.start()
        wait_for(lambda: fetch_all(pool, "SELECT id FROM sa_job"))
        with pytest.raises(openai.RateLimitError) as busy:
            client.chat.completions.create(**body)
        assert busy.value.code == "too_many_waiting"
        holder.join(timeout=20)
        assert outcome == [openai.ConflictError]
        # NOTE: no worker runs: the stream opens after the hold and closes at its time limit.
        with pytest.raises(openai.APIError) as limited:
            list(client.chat.completions.create(**body, stream=True))
        assert "SA_OPENAI_STREAM_MAX" in limited.value.message
    # NOTE: the refused request queued nothing: the held one and the streamed one did.
    assert len(fetch_all(pool, "SELECT id FROM sa_job")) == 2
