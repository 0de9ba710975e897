"""Bad data written behind the API's back never crashes a process: the job fails, the rest run."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.tokens import Caller
from jobqueue.engine.enqueue import enqueue
from tests.helpers import WorkerHarness, fetch_all, wait_for

__all__: list[str] = []

# NOTE: jsonb literals an operator could write with SQL; each one used to fail the claim
# statement's cast (or Python's decode of the claimed row) for every worker.
BAD_OPTIONS = [
    '{"depth": "abc"}',
    '{"depth": 99999999999}',
    '{"depth": 1e5000}',
    '{"depth": -1}',
    '{"depth": 2.5}',
    '{"depth": null}',
    '{"model": 5}',
]


def test_undecodable_options_fail_their_job_and_the_worker_runs_the_rest(
    pool: ConnectionPool[DictConnection], caller: Caller, workers: WorkerHarness,
) -> None:
    good = [enqueue(pool, caller, f"good {i}").job_id for i in range(3)]
    bad = []
    for literal in BAD_OPTIONS:
        job_id = enqueue(pool, caller, f"bad {literal}").job_id
        with pool.connection() as conn:
            conn.execute("UPDATE sa_job SET execution_options = %s::jsonb WHERE id = %s",
                         (literal, job_id))
        bad.append(job_id)

    workers.start(concurrency=2)
    wait_for(lambda: not fetch_all(pool, "SELECT 1 FROM sa_job WHERE state IN ('queued', 'running')"))

    rows = {r["id"]: r for r in fetch_all(
        pool, "SELECT id, state, error_kind, error_message, attempt FROM sa_job")}
    assert [rows[j]["state"] for j in good] == ["succeeded"] * 3
    for job_id in bad:
        row = rows[job_id]
        assert (row["state"], row["error_kind"], row["attempt"]) == ("failed", "invalid_options", 1)
        assert "execution_options" in row["error_message"]
    assert not fetch_all(pool, "SELECT 1 FROM sa_ledger WHERE job_id = ANY(%s)", bad)

    # The worker is still claiming: a job queued now runs to the end.
    later = enqueue(pool, caller, "after the bad ones").job_id
    wait_for(lambda: fetch_all(pool, "SELECT state FROM sa_job WHERE id = %s", later)[0]["state"]
             == "succeeded")


# --- operator output ---------------------------------------------------------------------------

HOSTILE = "red \x1b[31mALERT\x1b]0;owned\x07 back\rover \u202eevil\u2066 \x9b2J"
RAW_CONTROLS = ["\x1b", "\x07", "\r", "\u202e", "\u2066", "\x9b"]


def test_operator_output_escapes_tenants_control_characters(
    pool: ConnectionPool[DictConnection], caller: Caller, cli: Callable[[list[str]], int],
    capsys: pytest.CaptureFixture[str],
) -> None:
    job_id = enqueue(pool, caller, f"line one\n{HOSTILE}", options={"model": HOSTILE}).job_id
    with pool.connection() as conn:
        conn.execute("UPDATE sa_job SET state = 'cancelled', error_kind = 'unknown', "
                     "error_message = %s WHERE id = %s", (HOSTILE, job_id))

    assert cli(["job-details", str(job_id)]) == 0
    assert cli(["list-jobs"]) == 0
    out = capsys.readouterr().out

    assert not [c for c in RAW_CONTROLS if c in out]
    assert "  line one\n  red \\x1b[31mALERT\\x1b]0;owned\\x07 back\\x0dover \\u202eevil" in out
    assert "unknown: red \\x1b[31mALERT" in out

    # JSON output stays exact (and JSON-escaped).
    assert cli(["job-details", str(job_id), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["job"]["error_message"] == HOSTILE


@pytest.mark.parametrize(("name", "value"), [
    ("HTTPS_PROXY", "socks5://bob:hunter2@proxy.internal:1080"),
    ("SA_PROVIDER_URL", "ftp://bob:hunter2@provider.internal/v1"),
    ("SA_PROVIDER_URL", "https://bob:hunter2@provider.internal:99999/v1"),
])
def test_a_bad_provider_or_proxy_url_is_one_line_without_its_password(
    cli: Callable[[list[str]], int], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch, name: str, value: str,
) -> None:
    monkeypatch.setenv("SA_PROVIDER_URL", "https://provider.internal/v1")
    monkeypatch.setenv("NO_PROXY", "")
    monkeypatch.setenv(name, value)

    assert cli(["run-worker", "--once"]) == 2

    captured = capsys.readouterr()
    assert "hunter2" not in captured.out + captured.err
    assert "Traceback" not in captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sa-core: ")
    assert "provider URL" in lines[0] or "proxy" in lines[0]
