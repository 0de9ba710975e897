"""Usage (issue 14, item 4): tokens per attempt in the job and prompt answers, and per-org totals
over a time range from `sa-core usage`, archived calls included."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import falcon.testing
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.queries import inspection as inspection_q
from jobqueue.runtime.archive import Archiver
from tests.helpers import WorkerHarness, fetch_all, submit, wait_for

API = "/sa-core/v1"
Cli = Callable[[list[str]], int]


def test_jobs_and_prompts_show_the_tokens_of_each_attempt(
        client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness) -> None:
    # NOTE: the fake answers 503 once for this text, then the echo: 4 words in, and out the
    # same with "echo[1]:" ahead.
    done = submit(client, auth, text="count my tokens [fake:flaky=1]")
    workers.start()

    def finished() -> dict[str, object] | None:
        job = client.simulate_get(f"{API}/jobs/{done['job_id']}", headers=auth).json
        return job if job["state"] == "succeeded" else None

    job = wait_for(finished)
    # NOTE: no prices configured: the cost is unknown (null), never a made-up zero.
    assert [{k: u[k] for k in ("attempt", "tokens_in", "tokens_out", "route", "cost", "outcome",
                                "model", "http_status")} for u in job["usage"]] == [
        {"attempt": 1, "tokens_in": None, "tokens_out": None, "route": "default", "cost": None,
         "outcome": "provider_5xx", "model": "fake-model", "http_status": 503},
        {"attempt": 2, "tokens_in": 4, "tokens_out": 5, "route": "default", "cost": None,
         "outcome": "succeeded", "model": "fake-model", "http_status": 200}]
    assert all(u["latency_ms"] >= 0 and u["at"] for u in job["usage"])
    prompt = client.simulate_get(f"{API}/prompts/{done['prompt_id']}", headers=auth).json
    assert prompt["jobs"][0]["usage"] == job["usage"]


def test_usage_sums_tokens_per_org_and_model_over_the_range(
        client: falcon.testing.TestClient, auth: dict[str, str], other_org_auth: dict[str, str],
        workers: WorkerHarness, pool: ConnectionPool[DictConnection], cli: Cli,
        capsys: pytest.CaptureFixture[str]) -> None:
    for text in ("one two", "three four five"):
        submit(client, auth, text=text)
    submit(client, other_org_auth, text="six")
    workers.build().run(once=True)
    # NOTE: archived calls still count: usage is what was spent, not what is hot.
    Archiver(pool, Archiver.Config(batch_size=10)).run_once(datetime.now(UTC) + timedelta(days=1))
    assert not fetch_all(pool, "SELECT id FROM sa_ledger")

    def usage(*argv: str) -> dict[str, object]:
        capsys.readouterr()
        assert cli(["usage", "--json", *argv]) == 0
        return dict(json.loads(capsys.readouterr().out))

    everything = usage("--since", "1h")["items"]
    assert [(r["org_id"], r["model"], r["calls"], r["tokens_in"]) for r in everything] == [
        (1, "fake-model", 2, 2 + 3), (2, "fake-model", 1, 1)]
    # NOTE: the fake replies "echo[1]: user:" + the prompt: one word more than it received.
    assert [r["tokens_out"] for r in everything] == [5 + 2, 1 + 1]
    assert [r["org_id"] for r in usage("--org", "2", "--since", "1h")["items"]] == [2]
    assert usage("--since", (datetime.now(UTC) + timedelta(minutes=5)).isoformat())["items"] == []

    capsys.readouterr()
    assert cli(["usage", "--org", "1"]) == 0
    text = capsys.readouterr().out
    assert "since" in text and "org 1" in text and "fake-model" in text


def test_usage_refuses_a_bad_range(cli: Cli, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli(["usage", "--since", "last tuesday"])
    assert exited.value.code == 2
    assert "--since" in capsys.readouterr().err


def test_the_usage_range_is_served_by_the_ledger_brin_indexes(
        pool: ConnectionPool[DictConnection], truncated_tables: None) -> None:
    with pool.connection() as conn, conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL enable_seqscan = off")
        plan = conn.execute("EXPLAIN (FORMAT JSON) " + inspection_q.LEDGER_USAGE_SINCE,
                            {"since": datetime.now(UTC), "org_id": None}).fetchone()
    assert plan is not None
    assert "sa_ledger_created_brin" in json.dumps(plan)
    assert "sa_ledger_archive_created_brin" in json.dumps(plan)
