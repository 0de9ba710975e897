"""Metrics and logs: /metrics after real traffic matches the database, in one process and under gunicorn
with several processes; each worker serves its own port; request ids; structured, text-free logs."""

from __future__ import annotations

import re
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import falcon.testing
import httpx
import psycopg
import pytest
from prometheus_client.multiprocess import MultiProcessCollector
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.queries import metrics as metrics_q
from jobqueue.core.settings import Settings
from jobqueue.core.tokens import Caller, create_token
from jobqueue.engine.enqueue import enqueue
from tests.helpers import WorkerHarness, fetch_one, free_port, plan_nodes, submit, wait_for
from tests.metrics_page import parse, scrape, value
from tests.processes import log_lines, run_process

API = "/sa-core/v1"

def db_count(pool: ConnectionPool[DictConnection], where: str) -> int:
    return int(fetch_one(pool, f"SELECT count(*) AS n FROM sa_job_event WHERE {where}")["n"])


def db_queue(pool: ConnectionPool[DictConnection]) -> dict[str, Any]:
    return fetch_one(pool, """
        SELECT count(*) FILTER (WHERE state = 'queued') AS queued,
               count(*) FILTER (WHERE state = 'running') AS running,
               coalesce(extract(epoch FROM now() - min(scheduled_for) FILTER (WHERE state = 'queued')),
                        0)::float8 AS oldest
          FROM sa_job""")


def test_metrics_after_real_traffic_match_the_database(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection],
) -> None:
    before = scrape(client)
    answered = [submit(client, auth, text=f"answer me {i}") for i in range(3)]
    workers.build(concurrency=4).run(once=True)
    left = [submit(client, auth, text=f"wait for me {i}") for i in range(2)]
    assert client.simulate_get(f"{API}/jobs/{answered[0]['job_id']}", headers=auth).status_code == 200
    assert client.simulate_get(f"{API}/jobs/{uuid.uuid4()}", headers=auth).status_code == 404
    assert client.simulate_get("/no/such/page").status_code == 404

    ahead = db_queue(pool)
    result = client.simulate_get("/metrics")
    after = parse(result.text)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    queue = db_queue(pool)
    assert (queue["queued"], queue["running"]) == (len(left), 0)
    assert value(after, "sa_job_queue_depth", state="queued") == queue["queued"]
    assert value(after, "sa_job_queue_depth", state="running") == queue["running"]
    # NOTE: the scrape's age of the oldest job lies between the database's just before it and
    # just after (a loaded machine may pause a second between two statements).
    oldest = value(after, "sa_job_oldest_queued_seconds")
    assert ahead["oldest"] - 1.0 <= oldest <= queue["oldest"] + 1.0, (ahead, oldest, queue)
    assert oldest > 0
    assert result.text.count("# TYPE sa_job_queue_depth gauge") == 1

    assert delta("sa_jobs_enqueued_total") == 5 == db_count(pool, "from_state IS NULL")
    assert delta("sa_job_transitions_total", from_state="none", to_state="queued") == 5
    claimed = db_count(pool, "from_state = 'queued' AND to_state = 'running'")
    assert delta("sa_job_transitions_total", from_state="queued", to_state="running") == claimed == 3
    succeeded = db_count(pool, "to_state = 'succeeded'")
    assert delta("sa_job_transitions_total", from_state="running", to_state="succeeded") == succeeded == 3
    assert delta("sa_job_wait_seconds_count") == claimed
    assert delta("sa_job_claim_seconds_count") == 1  # the --once round's one claim statement
    assert delta("sa_job_run_seconds_count") == succeeded
    assert delta("sa_provider_request_seconds_count", outcome="ok") == succeeded
    tokens = fetch_one(pool, "SELECT sum(tokens_in) AS i, sum(tokens_out) AS o FROM sa_ledger")
    assert delta("sa_provider_tokens_total", route="default", direction="in") == tokens["i"] > 0
    assert delta("sa_provider_tokens_total", route="default", direction="out") == tokens["o"] > 0

    http = "sa_http_request_seconds_count"
    assert delta(http, route=f"{API}/prompt", method="POST", status="202") == 5
    assert delta(http, route=f"{API}/jobs/{{job_id:uuid}}", method="GET", status="200") == 1
    assert delta(http, route=f"{API}/jobs/{{job_id:uuid}}", method="GET", status="404") == 1
    assert delta(http, route="unmatched", method="GET", status="404") == 1
    routes = {dict(labels)["route"] for name, labels in after if name == http}
    assert not any(re.search(r"[0-9a-f]{8}-[0-9a-f]{4}-", route) for route in routes), routes
    assert {"unmatched", f"{API}/prompt", f"{API}/jobs/{{job_id:uuid}}"} <= routes


def test_the_request_id_is_taken_from_the_header_or_generated_and_always_returned(
    client: falcon.testing.TestClient, auth: dict[str, str],
) -> None:
    given = client.simulate_get("/healthz", headers={"X-Request-ID": "lb-7f3a.42"})
    assert given.headers["x-request-id"] == "lb-7f3a.42"
    generated = client.simulate_post(f"{API}/prompt", json={"text": "hi"}, headers=auth)
    assert len(generated.headers["x-request-id"]) == 32
    refused = client.simulate_get("/healthz", headers={"X-Request-ID": "x" * 500})
    assert len(refused.headers["x-request-id"]) == 32
    unauthorized = client.simulate_get(f"{API}/jobs/{uuid.uuid4()}", headers={"X-Request-ID": "abc"})
    assert (unauthorized.status_code, unauthorized.headers["x-request-id"]) == (401, "abc")


def test_the_page_is_served_without_the_queue_gauges_when_the_database_is_down(
    client: falcon.testing.TestClient, monkeypatch: pytest.MonkeyPatch,
) -> None:
    def down(pool: object) -> None:
        raise psycopg.OperationalError("connection refused")

    monkeypatch.setattr("jobqueue.core.exposition.read_queue_figures", down)
    result = client.simulate_get("/metrics")
    assert result.status_code == 200
    assert "sa_jobs_enqueued_total" in result.text
    assert "sa_job_queue_depth" not in result.text
    assert "sa_job_oldest_queued_seconds" not in result.text


def test_the_scrape_time_depth_read_touches_only_the_partial_indexes(
    pool: ConnectionPool[DictConnection],
) -> None:
    # A realistic table: a long finished history, a small backlog.
    with pool.connection() as conn, conn.transaction(force_rollback=True):
        conn.execute("INSERT INTO sa_entity (id, kind, org_id, created_by, correlation_id, content) "
                     "SELECT g, 'prompt', 1, 1, g, 'x' FROM (SELECT gen_random_uuid() AS g "
                     "FROM generate_series(1, 6000)) s")
        conn.execute("INSERT INTO sa_job (id, prompt_id, org_id, created_by) "
                     "SELECT gen_random_uuid(), id, 1, 1 FROM sa_entity")
        conn.execute("UPDATE sa_job SET state = 'running', worker_claim = 'w', "
                     "running_heartbeat_at = now() WHERE ctid IN (SELECT ctid FROM sa_job LIMIT 5950)")
        conn.execute("UPDATE sa_job SET state = 'failed' WHERE state = 'running' AND ctid IN "
                     "(SELECT ctid FROM sa_job WHERE state = 'running' LIMIT 5900)")
        conn.execute("ANALYZE sa_job")
        nodes = plan_nodes(conn, metrics_q.JOB_QUEUE_DEPTH)
        partial = {r["name"]: r["predicate"] for r in conn.execute(
            "SELECT indexrelid::regclass::text AS name, pg_get_expr(indpred, indrelid) AS predicate "
            "FROM pg_index WHERE indrelid = 'sa_job'::regclass AND indpred IS NOT NULL").fetchall()}
    active = {name for name, predicate in partial.items()
              if predicate in ("(state = 'queued'::text)", "(state = 'running'::text)",
                               "((state = 'queued'::text) AND (NOT waiting))")}
    assert {"sa_job_claim_idx", "sa_job_worker_claim_idx", "sa_job_heartbeat_idx"} <= active
    scans = {(n["Node Type"], n.get("Index Name")) for n in nodes if n.get("Relation Name") == "sa_job"}
    assert scans, nodes
    assert all(index in active for _, index in scans), scans



# --- real processes ----------------------------------------------------------------------------


def _get(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=2.0)
    except httpx.HTTPError:
        return None


def _enqueued_by_process(directory: Path) -> dict[str, float]:
    """sa_jobs_enqueued_total of each web process that has enqueued something, from its own file."""
    counts = {}
    for path in directory.glob("counter_*.db"):
        for family in MultiProcessCollector.merge([str(path)]):  # type: ignore[no-untyped-call]
            for sample in family.samples:
                if sample.name == "sa_jobs_enqueued_total" and sample.value > 0:
                    counts[path.stem] = sample.value
    return counts


def test_gunicorn_with_two_processes_reports_every_processs_traffic_in_each_scrape(
    settings: Settings, pool: ConnectionPool[DictConnection], tmp_path: Path,
) -> None:
    port, secret = free_port(), f"secret-prompt-{uuid.uuid4().hex}"
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    env = {"DATABASE_URL": settings.database_url, "PORT": str(port), "WEB_CONCURRENCY": "2",
           "PROMETHEUS_MULTIPROC_DIR": str(multiproc)}
    base = f"http://127.0.0.1:{port}"
    token = create_token(pool, 5, 50)
    headers = {"Authorization": f"Bearer {token}"}
    log = tmp_path / "web.log"
    with run_process([sys.executable, "-m", "gunicorn", "-c", "python:service.gunicorn_conf",
                   "service.app:create_app()"], env, log) as web:
        wait_for(lambda: web.poll() is None and (r := _get(f"{base}/readyz")) is not None
                 and r.status_code == 200, timeout=30, interval=0.1)
        traced = httpx.post(f"{base}{API}/prompt", json={"text": secret},
                            headers={**headers, "X-Request-ID": "trace-me-1"}, timeout=10)
        assert traced.status_code == 202 and traced.headers["x-request-id"] == "trace-me-1"
        sent = 1

        # NOTE: fresh connections from several threads, batch after batch, until both processes
        # have served submits (which process accepts a connection is the kernel's choice).
        def post_some() -> None:
            for _ in range(3):
                assert httpx.post(f"{base}{API}/prompt", json={"text": "load"}, headers=headers,
                                  timeout=10).status_code == 202

        for _ in range(20):
            threads = [threading.Thread(target=post_some) for _ in range(3)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            sent += 9
            if len(_enqueued_by_process(multiproc)) >= 2:
                break
        assert len(_enqueued_by_process(multiproc)) == 2

        queued = db_queue(pool)["queued"]
        for _ in range(6):
            page = httpx.get(f"{base}/metrics", timeout=10)
            assert page.status_code == 200
            samples = parse(page.text)
            assert value(samples, "sa_jobs_enqueued_total") == sent
            assert value(samples, "sa_http_request_seconds_count", route=f"{API}/prompt",
                         method="POST", status="202") == sent
            assert value(samples, "sa_job_queue_depth", state="queued") == queued == sent
            assert page.text.count("# TYPE sa_job_queue_depth gauge") == 1
        job_id = traced.json()["job_id"]
        cancelled = httpx.post(f"{base}{API}/jobs/{job_id}/cancel",
                               headers={**headers, "X-Request-ID": "trace-me-2"}, timeout=10)
        assert cancelled.status_code == 200
        samples = parse(httpx.get(f"{base}/metrics", timeout=10).text)
        assert value(samples, "sa_job_transitions_total", from_state="queued", to_state="cancelled") == 1
        assert value(samples, "sa_job_queue_depth", state="queued") == sent - 1

        # Both processes report their own pool (one series per pid), the streams they hold
        # open, and which build runs; no worker-only family is shown empty.
        with httpx.stream("GET", f"{base}{API}/mission/events", headers=headers, timeout=10) as stream:
            assert stream.status_code == 200

            def streams_open() -> float:
                return value(parse(httpx.get(f"{base}/metrics", timeout=10).text), "sa_sse_streams_open")

            wait_for(lambda: streams_open() == 1, timeout=15, interval=0.2)
        page = httpx.get(f"{base}/metrics", timeout=10).text
        pools = [labels for (name, labels) in parse(page)
                 if name == "sa_db_pool_connections" and ("state", "max") in labels]
        assert len(pools) == 2 and all(("pool", "web") in labels for labels in pools), pools
        assert [s for s in parse(page) if s[0] == "sa_build_info"] != []
        assert "sa_worker_slots" not in page

    lines = log_lines(log)
    request = [line for line in lines if line["event"] == "http.request"
               and line.get("request_id") == "trace-me-1"]
    assert len(request) == 1
    assert (request[0]["route"], request[0]["status"], request[0]["org_id"]) == (f"{API}/prompt", 202, 5)
    enqueued = [line for line in lines if line["event"] == "job.enqueued"
                and line.get("request_id") == "trace-me-1"]
    assert len(enqueued) == 1
    assert enqueued[0]["job_id"] == traced.json()["job_id"]
    assert (enqueued[0]["org_id"], enqueued[0]["to_state"]) == (5, "queued")
    cancel = [line for line in lines if line.get("request_id") == "trace-me-2"]
    assert [line["event"] for line in cancel] == ["job.cancelled", "http.request"]
    assert (cancel[0]["job_id"], cancel[0]["from_state"], cancel[0]["to_state"]) == (
        enqueued[0]["job_id"], "queued", "cancelled")
    assert cancel[1]["job_id"] == enqueued[0]["job_id"]
    assert cancel[1]["route"] == f"{API}/jobs/{{job_id:uuid}}/cancel"
    assert secret not in log.read_text()


def test_a_worker_serves_its_own_metrics_and_logs_each_transition_without_text(
    settings: Settings, pool: ConnectionPool[DictConnection], tmp_path: Path, caller: Caller,
) -> None:
    secret = f"secret-prompt-{uuid.uuid4().hex}"
    job = enqueue(pool, caller, secret)
    port = free_port()
    env = {"DATABASE_URL": settings.database_url, "SA_PROVIDER_URL": settings.provider_url,
           "SA_METRICS_PORT": str(port), "SA_POLL_INTERVAL": "0.05", "SA_SHUTDOWN_GRACE": "2",
           "PROMETHEUS_MULTIPROC_DIR": None}
    log = tmp_path / "worker.log"
    with run_process([sys.executable, "-m", "jobqueue.operator.cli", "run-worker", "--concurrency", "2"],
                  env, log) as worker:  # type: ignore[arg-type]
        wait_for(lambda: fetch_one(pool, "SELECT state FROM sa_job WHERE id = %s", job.job_id)[
            "state"] == "succeeded", timeout=20)
        page = wait_for(lambda: _get(f"http://127.0.0.1:{port}/metrics"), timeout=10)
        samples = parse(page.text)
        assert value(samples, "sa_job_transitions_total", from_state="queued", to_state="running") == 1
        assert value(samples, "sa_job_transitions_total", from_state="running", to_state="succeeded") == 1
        assert value(samples, "sa_provider_request_seconds_count", outcome="ok") == 1
        assert value(samples, "sa_job_run_seconds_count") == 1
        assert value(samples, "sa_worker_slots", state="busy") == 0
        assert value(samples, "sa_worker_slots", state="free") == 2
        slow = enqueue(pool, caller, "[fake:latency=3] hold a slot")
        wait_for(lambda: fetch_one(pool, "SELECT state FROM sa_job WHERE id = %s", slow.job_id)[
            "state"] == "running", timeout=20)
        held = parse(_get(f"http://127.0.0.1:{port}/metrics").text)
        assert value(held, "sa_worker_slots", state="busy") == 1
        assert value(held, "sa_worker_slots", state="free") == 1
        assert value(samples, "sa_db_pool_connections", pool="worker", state="max") == 6
        assert [s for s in samples if s[0] == "sa_build_info"] != []
        # NOTE: only what a worker produces: no web family, not even an empty one.
        assert "sa_http_request_seconds" not in page.text and "sa_jobs_enqueued" not in page.text
        # NOTE: info lines are buffered, but reach the log within FLUSH_INTERVAL while it runs.
        wait_for(lambda: '"job.finalized"' in log.read_text(), timeout=5)
        assert worker.poll() is None
    assert worker.returncode == 0

    lines = [line for line in log_lines(log) if line.get("job_id") == str(job.job_id)]
    events = [line["event"] for line in lines]
    assert events == ["job.claimed", "provider.request", "job.finalized"], events
    for line in lines:
        assert line["prompt_id"] == str(job.prompt_id)
        assert line["org_id"] == caller.org_id
        assert line["worker_id"]
    assert (lines[0]["from_state"], lines[0]["to_state"]) == ("queued", "running")
    assert (lines[2]["from_state"], lines[2]["to_state"]) == ("running", "succeeded")
    assert lines[1]["outcome"] == "ok" and lines[1]["http_status"] == 200
    assert secret not in log.read_text()
