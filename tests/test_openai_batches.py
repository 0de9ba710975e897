"""The Files and Batch APIs, driven by the official `openai` SDK over real HTTP, with workers and
the batch keeper against the fake provider: upload, a batch polled to completed with its output
and error files matched to custom_ids, the bulk lane, cancel, a window that expires, tenancy,
retention and the bounds."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import openai
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.routes import load_routes
from jobqueue.core.settings import Settings
from jobqueue.runtime.batch_keeper import BatchCounts, BatchKeeper
from jobqueue.runtime.retention import Retention
from tests.helpers import WorkerHarness, fetch_all, fetch_one, running_keeper, serve_app, wait_for
from tests.metrics_page import Samples, parse, value


@pytest.fixture
def settings(base_settings: Settings) -> Settings:
    return replace(base_settings, batch_interval=0.05)


@pytest.fixture
def base(settings: Settings, pool: ConnectionPool[DictConnection]) -> Iterator[str]:
    with serve_app(settings, pool) as url:
        yield url


def _client(base: str, auth: dict[str, str]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/openai/v1", max_retries=0,
                         api_key=auth["Authorization"].removeprefix("Bearer "))


def _line(custom_id: str, text: str, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "fake-model", "messages": [{"role": "user", "content": text}],
                     **body}}


def _jsonl(lines: list[Any]) -> bytes:
    return b"".join((line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n"
                    for line in lines)


def _upload(client: openai.OpenAI, lines: list[Any]) -> str:
    return client.files.create(file=("in.jsonl", _jsonl(lines)), purpose="batch").id


def _finished(client: openai.OpenAI, batch_id: str, status: str = "completed",
              timeout: float = 30) -> Any:
    return wait_for(lambda: (b := client.batches.retrieve(batch_id)).status == status and b,
                    timeout=timeout, interval=0.1)


def _lines_of(client: openai.OpenAI, file_id: str | None) -> dict[str | None, dict[str, Any]]:
    assert file_id is not None
    return {line["custom_id"]: line for line in map(
        json.loads, client.files.content(file_id).read().decode().splitlines())}


def test_a_file_is_uploaded_read_listed_and_deleted_within_its_org(
        base: str, auth: dict[str, str], other_org_auth: dict[str, str]) -> None:
    client = _client(base, auth)
    data = _jsonl([_line("a", "hello"), _line("b", "world")])
    created = client.files.create(file=("mine.jsonl", data), purpose="batch")
    assert (created.bytes, created.filename, created.purpose) == (len(data), "mine.jsonl", "batch")
    assert created.id.startswith("file-") and created.expires_at is not None
    assert client.files.retrieve(created.id).bytes == len(data)
    assert client.files.content(created.id).read() == data
    assert [f.id for f in client.files.list()] == [created.id]
    stranger = _client(base, other_org_auth)
    with pytest.raises(openai.NotFoundError):
        stranger.files.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        stranger.files.content(created.id)
    with pytest.raises(openai.NotFoundError):
        stranger.files.delete(created.id)
    assert list(stranger.files.list()) == []
    assert client.files.delete(created.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(created.id)


def test_a_batch_runs_to_completed_with_its_output_and_error_files_matched_to_custom_ids(
        base: str, auth: dict[str, str], other_org_auth: dict[str, str], settings: Settings,
        pool: ConnectionPool[DictConnection], workers: WorkerHarness) -> None:
    client = _client(base, auth)
    lines: list[Any] = [_line(f"ok-{n}", f"question {n}", temperature=0.2) for n in range(3)]
    lines += [_line("refused", "no [fake:400]"), b"{not json", b"",
              _line("tools", "x", tools=[{"type": "function", "function": {"name": "f"}}]),
              _line("ok-0", "a repeated custom_id"),
              # NOTE: valid JSON the database cannot store (jsonb holds no NUL): its page is
              # split until this line alone is refused, and only it fails.
              _line("nul", "x", response_format={"type": "json_schema", "json_schema": {
                  "name": "s", "schema": {"description": "a\x00b"}}})]
    input_id = _upload(client, lines)
    workers.start(listen=True, poll_interval=600)
    with running_keeper(settings, pool):
        batch = client.batches.create(input_file_id=input_id, endpoint="/v1/chat/completions",
                                      completion_window="24h", metadata={"run": "nightly"})
        assert batch.status == "validating" and batch.metadata == {"run": "nightly"}
        done = _finished(client, batch.id)
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed,
            done.request_counts.failed) == (8, 3, 5)
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    assert done.usage is not None and done.usage.output_tokens > 0
    output = _lines_of(client, done.output_file_id)
    assert set(output) == {"ok-0", "ok-1", "ok-2"}
    for n in range(3):
        response = output[f"ok-{n}"]["response"]
        assert response["status_code"] == 200 and output[f"ok-{n}"]["error"] is None
        assert response["body"]["object"] == "chat.completion"
        assert response["body"]["choices"][0]["message"]["content"] == (
            f"echo[1]: user:question {n}")
    errors = _lines_of(client, done.error_file_id)
    assert set(errors) == {"refused", None, "tools", "ok-0", "nul"}
    assert "cannot be stored" in errors["nul"]["error"]["message"]
    assert errors["refused"]["response"]["status_code"] == 400
    assert errors["refused"]["response"]["body"]["error"]["code"] == "provider_4xx"
    assert errors[None]["error"]["code"] == "invalid_json"
    assert errors["tools"]["error"]["code"] == "unsupported_parameter"
    assert errors["ok-0"]["error"]["code"] == "duplicate_custom_id"
    # NOTE: each line ran as a job in the bulk lane, below interactive work.
    assert {r["priority"] for r in fetch_all(pool, "SELECT priority FROM sa_job")} == {
        settings.batch_priority}
    assert [b.id for b in client.batches.list()] == [batch.id]
    stranger = _client(base, other_org_auth)
    with pytest.raises(openai.NotFoundError):
        stranger.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        stranger.batches.cancel(batch.id)
    with pytest.raises(openai.NotFoundError):
        stranger.batches.create(input_file_id=input_id, endpoint="/v1/chat/completions",
                                completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        stranger.files.content(str(done.output_file_id))


def test_the_bulk_lane_feeds_lines_in_as_room_appears(
        base: str, auth: dict[str, str], settings: Settings,
        pool: ConnectionPool[DictConnection], workers: WorkerHarness) -> None:
    lane = replace(settings, batch_max_queued=2)
    client = _client(base, auth)
    input_id = _upload(client, [_line(f"r{n}", f"line {n}") for n in range(8)])
    in_flight: list[int] = []

    def watch(counts: BatchCounts) -> None:
        in_flight.append(fetch_one(pool, "SELECT count(*) AS n FROM sa_job "
                                         "WHERE state IN ('queued', 'running')")["n"])

    keeper = BatchKeeper(pool, BatchKeeper.Config.from_settings(lane), on_round=watch).start()
    try:
        batch = client.batches.create(input_file_id=input_id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
        wait_for(lambda: fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"] == 2)
        workers.start(listen=True, poll_interval=600)
        done = _finished(client, batch.id)
    finally:
        keeper.stop()
    assert done.request_counts is not None and done.request_counts.completed == 8
    assert max(in_flight) == 2


def test_request_counts_move_as_lines_finish_while_the_batch_runs(
        base: str, auth: dict[str, str], settings: Settings,
        pool: ConnectionPool[DictConnection], workers: WorkerHarness) -> None:
    client = _client(base, auth)
    lines = [_line("a", "quick one"), _line("b", "quick two"), _line("no", "no [fake:400]"),
             _line("slow", "slow one [fake:latency=3]")]
    workers.start(listen=True, poll_interval=600)
    with running_keeper(settings, pool):
        batch = client.batches.create(input_file_id=_upload(client, lines),
                                      endpoint="/v1/chat/completions", completion_window="24h")
        # NOTE: what a client polling the batch sees while its slow line still runs.
        running = wait_for(lambda: (b := client.batches.retrieve(batch.id)).request_counts
                           and (b.request_counts.completed, b.request_counts.failed) == (2, 1)
                           and b, timeout=20, interval=0.1)
        assert running.status == "in_progress" and running.request_counts.total == 4
        done = _finished(client, batch.id)
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (3, 1)


def test_a_cancelled_batch_ends_its_queued_lines_and_reports_them(
        base: str, auth: dict[str, str], settings: Settings,
        pool: ConnectionPool[DictConnection]) -> None:
    client = _client(base, auth)
    input_id = _upload(client, [_line(f"c{n}", f"later {n}") for n in range(5)])
    with running_keeper(replace(settings, batch_max_queued=3), pool):
        batch = client.batches.create(input_file_id=input_id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
        wait_for(lambda: client.batches.retrieve(batch.id).status == "in_progress")
        wait_for(lambda: fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"] == 3)
        assert client.batches.cancel(batch.id).status == "cancelling"
        done = _finished(client, batch.id, "cancelled")
    assert done.cancelled_at and done.output_file_id is None
    errors = _lines_of(client, done.error_file_id)
    assert set(errors) == {f"c{n}" for n in range(5)}
    assert {line["error"]["code"] for line in errors.values()} == {"batch_cancelled"}
    assert {r["state"] for r in fetch_all(pool, "SELECT state FROM sa_job")} == {"cancelled"}


def _samples(base: str) -> Samples:
    result = httpx.get(f"{base}/metrics")
    assert result.status_code == 200, result.text
    return parse(result.text)


def test_a_batchs_feed_and_cancel_are_counted_and_settle_the_chains_waiting_on_it(
        base: str, auth: dict[str, str], settings: Settings,
        pool: ConnectionPool[DictConnection]) -> None:
    """The engine records both batch transitions, and a cancel settles its chains at once: no
    maintenance leader runs here, so no sweep could have ended the dependent."""
    client = _client(base, auth)
    input_id = _upload(client, [_line(f"d{n}", f"later {n}") for n in range(5)])
    start = _samples(base)

    def delta(samples: Samples, name: str, **labels: str) -> float:
        return value(samples, name, **labels) - value(start, name, **labels)

    with running_keeper(replace(settings, batch_max_queued=3), pool):
        batch = client.batches.create(input_file_id=input_id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
        wait_for(lambda: fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"] == 3)
        fed = _samples(base)
        assert delta(fed, "sa_job_transitions_total", from_state="none", to_state="queued") == 3
        assert delta(fed, "sa_jobs_enqueued_total") == 3
        predecessor = fetch_one(pool, "SELECT id FROM sa_job ORDER BY created_at LIMIT 1")["id"]
        waiting = httpx.post(f"{base}/sa-core/v1/prompt", headers=auth,
                             json={"text": "after a batch line", "after": str(predecessor)})
        assert waiting.status_code == 202, waiting.text
        client.batches.cancel(batch.id)
        _finished(client, batch.id, "cancelled")
    dependent = fetch_one(pool, "SELECT state, error_kind FROM sa_job WHERE id = %s",
                          waiting.json()["job_id"])
    assert (dependent["state"], dependent["error_kind"]) == ("cancelled", "dependency_failed")
    end = _samples(base)
    assert delta(end, "sa_job_transitions_total", from_state="none", to_state="queued") == 4
    # NOTE: the batch's three queued jobs, and the job waiting on one of them.
    assert delta(end, "sa_job_transitions_total", from_state="queued", to_state="cancelled") == 4
    assert delta(end, "sa_job_failures_total", error_kind="dependency_failed") == 1
    events = fetch_one(pool, "SELECT count(*) AS n FROM sa_job_event WHERE to_state = 'cancelled'")
    assert events["n"] == 4


def test_at_the_windows_end_unfinished_lines_are_cancelled_and_finished_ones_returned(
        settings: Settings, pool: ConnectionPool[DictConnection], auth: dict[str, str],
        workers: WorkerHarness) -> None:
    # NOTE: "24h" lasts what SA_BATCH_WINDOW says: 2.5 s here.
    short = replace(settings, batch_window=2.5)
    lines = [_line("quick", "fast one"), _line("slow", "slow one [fake:latency=4.5]"),
             _line("never", "never fed")]
    workers.start(listen=True, poll_interval=600)
    with serve_app(short, pool) as url, running_keeper(replace(short, batch_max_queued=1), pool):
        client = _client(url, auth)
        batch = client.batches.create(input_file_id=_upload(client, lines),
                                      endpoint="/v1/chat/completions", completion_window="24h")
        assert batch.completion_window == "24h" and batch.expires_at is not None
        done = _finished(client, batch.id, "expired")
        assert done.expired_at is not None and done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (1, 0)
        output = _lines_of(client, done.output_file_id)
        errors = _lines_of(client, done.error_file_id)
    assert output["quick"]["response"]["body"]["choices"][0]["message"]["content"] == (
        "echo[1]: user:fast one")
    assert set(errors) == {"slow", "never"}
    assert {line["error"]["code"] for line in errors.values()} == {"batch_expired"}
    assert fetch_one(pool, "SELECT state FROM sa_job j JOIN sa_entity e ON e.id = j.prompt_id "
                           "WHERE e.content LIKE 'slow one%%'")["state"] == "cancelled"


def test_a_batch_none_of_whose_lines_can_run_fails_naming_them(
        base: str, auth: dict[str, str], settings: Settings,
        pool: ConnectionPool[DictConnection]) -> None:
    client = _client(base, auth)
    # NOTE: a `prefer_provider` naming no route is refused like the chat route refuses it; the
    # worker would pass it over without a word.
    input_id = _upload(client, [b"[]", _line("m", "x", n=3), _line("u", "x") | {"url": "/v1/x"},
                                _line("p", "x", prefer_provider="nowhere")])
    with running_keeper(settings, pool):
        batch = client.batches.create(input_file_id=input_id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
        done = _finished(client, batch.id, "failed")
    assert done.failed_at is not None and done.errors is not None and done.errors.data
    assert [(e.line, e.code) for e in done.errors.data] == [
        (1, "invalid_request"), (2, "invalid_value"), (3, "invalid_url"), (4, "invalid_value")]
    prefer = done.errors.data[3]
    assert prefer.param == "body.prefer_provider"
    assert prefer.message == ("No route `nowhere` serves the model `fake-model` (known routes "
                              "serving it: default).")
    assert fetch_all(pool, "SELECT id FROM sa_job") == []
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


def test_a_line_whose_model_or_prefer_provider_no_route_serves_is_a_line_error(
        auth: dict[str, str], settings: Settings, pool: ConnectionPool[DictConnection],
        workers: WorkerHarness) -> None:
    routes = {"routes": [{"name": "other", "base_url": settings.provider_url,
                          "models": ["m-other"]}]}
    routed = replace(settings, provider_routes=load_routes(
        {"SA_PROVIDER_ROUTES": json.dumps(routes)}))
    lines = [_line("preferred", "hello", prefer_provider="default"),
             _line("elsewhere", "hello", prefer_provider="other"),
             _line("nowhere", "hello") | {"body": {
                 "model": "m-none", "messages": [{"role": "user", "content": "hello"}]}}]
    workers.start(listen=True, poll_interval=600)
    with serve_app(routed, pool) as url, running_keeper(routed, pool):
        client = _client(url, auth)
        batch = client.batches.create(input_file_id=_upload(client, lines),
                                      endpoint="/v1/chat/completions", completion_window="24h")
        done = _finished(client, batch.id)
        output = _lines_of(client, done.output_file_id)
        errors = _lines_of(client, done.error_file_id)
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 2)
    assert output["preferred"]["response"]["status_code"] == 200
    assert (errors["elsewhere"]["error"]["code"], errors["elsewhere"]["error"]["message"]) == (
        "invalid_value", "No route `other` serves the model `fake-model` (known routes serving "
        "it: default).")
    assert errors["nowhere"]["error"]["code"] == "model_not_found"
    # NOTE: only the line that can run became a job.
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"] == 1


def test_retention_removes_expired_files_and_old_batches(
        base: str, auth: dict[str, str], settings: Settings,
        pool: ConnectionPool[DictConnection], workers: WorkerHarness) -> None:
    client = _client(base, auth)
    input_id = _upload(client, [_line("a", "x")])
    workers.start(listen=True, poll_interval=600)
    with running_keeper(settings, pool):
        batch = client.batches.create(input_file_id=input_id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
        done = _finished(client, batch.id)
    kept = _upload(client, [_line("b", "y")])
    # NOTE: the clock is moved on in the database: the input file expired, the batch ended long ago.
    with pool.connection() as conn:
        conn.execute("UPDATE sa_file SET expires_at = now() - interval '1 s' WHERE id <> %s",
                     (uuid.UUID(kept.removeprefix("file-")),))
        conn.execute("UPDATE sa_batch SET created_at = created_at - interval '40 days', "
                     "completed_at = completed_at - interval '40 days'")
    counts = Retention(Retention.Config(archive_after=0, idempotency_key_retention=0,
                                        batch_retention=30 * 86400)).run_once(pool)
    assert (counts.removed_files, counts.removed_batches) == (2, 1)
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(input_id)
    with pytest.raises(openai.NotFoundError):
        client.files.content(str(done.output_file_id))
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve(batch.id)
    assert client.files.retrieve(kept).id == kept
    assert fetch_all(pool, "SELECT * FROM sa_batch_request") == []
