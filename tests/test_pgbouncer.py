"""The web (gunicorn as the Procfile runs it) and workers behind Debian's PgBouncer in transaction mode.

Queries go through the pooler (`DATABASE_URL`); LISTEN and the maintenance leader's session use
the server itself (`SA_DIRECT_DATABASE_URL`), as ops/README.md's PgBouncer section says. That
direct URL declares the pooler (SA_DATABASE_POOLER), so with every other setting at its default
the worker sends no startup option (PgBouncer refuses them) and its timeouts are its role's.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from jobqueue.core.tokens import create_token
from jobqueue.core.wakeup import WakeupSender
from jobqueue.devtools.fake_provider import FakeProvider
from tests.helpers import answers, free_port, require_tool, wait_for
from tests.hosts import VENV_BIN, Bouncer, Process, conninfo_host_port, procfile_command

PROMPTS = 40
SESSION_BOUND = """
SELECT a.pid, CASE WHEN l.pid IS NOT NULL THEN 'leader' ELSE 'listen' END AS use
  FROM pg_stat_activity a
  LEFT JOIN pg_locks l ON l.pid = a.pid AND l.locktype = 'advisory' AND l.granted
 WHERE a.datname = %(dbname)s AND (a.query LIKE 'LISTEN%%' OR l.pid IS NOT NULL)
"""


@pytest.fixture
def worker_role(database_url: str) -> Iterator[str]:
    """A login role for the workers with the timeouts set on it (ALTER ROLE), dropped afterwards."""
    role = f"sa_worker_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as admin:
        for statement in (f"CREATE ROLE {role} LOGIN",
                          f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}",
                          f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}",
                          f"ALTER ROLE {role} SET statement_timeout = '30s'",
                          f"ALTER ROLE {role} SET lock_timeout = '10s'"):
            admin.execute(statement)
    try:
        yield role
    finally:
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")


@pytest.fixture
def bouncer(database_url: str, worker_role: str) -> Iterator[Bouncer]:
    require_tool("pgbouncer", install="apt-get install pgbouncer")
    # NOTE: a directory of our own, not tmp_path: as root PgBouncer runs as `postgres`, which
    # cannot enter pytest's private temporary tree.
    root = Path(tempfile.mkdtemp(prefix="sa-pgbouncer-"))
    host, port = conninfo_host_port(database_url)
    try:
        with Bouncer(root, "127.0.0.1", free_port(), host, port,
                     users=("postgres", worker_role), pool_size=5) as pooler:
            yield pooler
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_web_and_workers_serve_prompts_through_pgbouncer_in_transaction_mode(
    bouncer: Bouncer, worker_role: str, database_url: str, fake: FakeProvider,
    pool: ConnectionPool[DictConnection],
) -> None:
    dbname = str(psycopg.conninfo.conninfo_to_dict(database_url)["dbname"])
    # NOTE: a poll once a minute, so the jobs are picked up within the test's bounds only if the
    # web's wake-up notifications (sent through the pooler) reach the workers' LISTEN.
    common = {"PATH": f"{VENV_BIN}:{os.environ['PATH']}", "SA_DIRECT_DATABASE_URL": database_url,
              "SA_POLL_INTERVAL": "60", "SA_HEARTBEAT_INTERVAL": "0.5"}
    port = free_port()
    logs = Path(bouncer.root)
    web = Process(["sh", "-c", f"exec {procfile_command('web')}"],
                  {**os.environ, **common, "PORT": str(port),
                   "DATABASE_URL": bouncer.url(dbname)}, logs / "web.log")
    workers = [Process(["sh", "-c", f"exec {procfile_command('worker')} --concurrency 8"],
                       {**_defaults(), **common, "DATABASE_URL": bouncer.url(dbname, worker_role),
                        "SA_PROVIDER_URL": fake.url, "SA_PROVIDER_MODEL": "fake-model"},
                       logs / f"worker{i}.log") for i in range(2)]
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: answers(f"{base}/readyz"), timeout=60, interval=0.1)
        headers = {"Authorization": f"Bearer {create_token(pool, 1, 10)}"}
        with httpx.Client(base_url=base, headers=headers, timeout=10) as http:
            # NOTE: well past psycopg's 5 executions per connection that would prepare a
            # statement the pooler's next server session does not have (a 500 before the fix),
            # from 8 clients at once so the pooler does hand sessions around.
            def post(i: int) -> str:
                answer = http.post("/sa-core/v1/prompt", json={"text": f"pooled {i}"})
                assert answer.status_code == 202, answer.text
                return str(answer.json()["job_id"])

            with ThreadPoolExecutor(8) as clients:
                jobs = list(clients.map(post, range(PROMPTS)))

            def all_succeeded() -> bool:
                states = [http.get(f"/sa-core/v1/jobs/{job}").json()["state"] for job in jobs]
                return all(state == "succeeded" for state in states)

            wait_for(all_succeeded, timeout=40, interval=0.2)
        # NOTE: every session-bound use (the workers' and the web's LISTENs, the maintenance
        # leader's lock) is on a direct session: none is one of PgBouncer's server connections.
        pooled = {r["remote_pid"] for r in bouncer.show("SERVERS")}
        with pool.connection() as conn:
            sessions = conn.execute(SESSION_BOUND, {"dbname": dbname}).fetchall()
        assert {r["use"] for r in sessions} == {"listen", "leader"}, sessions
        assert sum(r["use"] == "listen" for r in sessions) >= 3  # 2 workers, 1 per web process
        assert not {r["pid"] for r in sessions} & pooled
    finally:
        for process in (web, *workers):
            process.stop()
    assert all(p.popen.returncode == 0 for p in workers), [p.lines()[-5:] for p in workers]
    # NOTE: nothing failed on the way: no statement the pooler could not run (a prepared one
    # missing from the next server session), no wake-up notification lost to one.
    failures = [line for p in (web, *workers) for line in p.lines()
                if '"level": "error"' in line or "send_failed" in line or '"status": 500' in line]
    assert failures == []
    with pool.connection() as conn:
        row = conn.execute("SELECT count(*) AS jobs, count(*) FILTER (WHERE state = 'succeeded') "
                           "AS succeeded, count(DISTINCT prompt_id) AS prompts FROM sa_job").fetchone()
    assert row == {"jobs": PROMPTS, "succeeded": PROMPTS, "prompts": PROMPTS}
    # NOTE: the pooler carried the web's and the workers' transactions (each submit and each
    # status read is at least one) on at most 5 server connections per role.
    stats = {r["database"]: r for r in bouncer.show("STATS")}
    assert stats[dbname]["total_xact_count"] > 2 * PROMPTS
    pools = [r for r in bouncer.show("POOLS") if r["database"] == dbname]
    assert {r["user"] for r in pools} == {"postgres", worker_role}
    assert all(r["sv_active"] + r["sv_idle"] + r["sv_used"] <= 5 for r in pools)
    # NOTE: each worker said where its timeouts come from: its role's settings, as set.
    for worker in workers:
        said = [json.loads(line) for line in worker.lines() if '"worker.database_timeouts' in line]
        assert [(e["event"], e["statement_timeout"], e["lock_timeout"]) for e in said] == [
            ("worker.database_timeouts", "30s", "10s")], said


def _defaults() -> dict[str, str]:
    """This environment without any sa-core setting: what a deployment that sets only URLs has."""
    return {key: value for key, value in os.environ.items()
            if not key.startswith("SA_") and key not in ("DATABASE_URL", "LOG_LEVEL")}


def _run_worker(env: dict[str, str], seconds: float) -> subprocess.CompletedProcess[str]:
    """`sa-core run-worker` for at most `seconds`, then SIGTERM; its output as text."""
    child = subprocess.Popen([str(Path(sys.executable).parent / "sa-core"), "run-worker"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = child.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        child.terminate()
        out, err = child.communicate(timeout=30)
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)


def test_an_undeclared_pooler_stops_the_worker_at_once_with_one_line_naming_it(
    bouncer: Bouncer, database_url: str, fake: FakeProvider,
) -> None:
    dbname = str(psycopg.conninfo.conninfo_to_dict(database_url)["dbname"])
    started = time.monotonic()
    done = _run_worker({**_defaults(), "DATABASE_URL": bouncer.url(dbname),
                        "SA_PROVIDER_URL": fake.url}, seconds=30)
    assert done.returncode == 2 and done.stdout == ""
    # NOTE: at once, not after the pool's 10 s of retries (and warnings) at start.
    assert time.monotonic() - started < 8
    [line] = done.stderr.splitlines()
    assert "unsupported startup parameter: options" in line and "SA_DATABASE_POOLER=transaction" in line


def test_a_declared_pooler_whose_role_has_no_timeouts_warns_with_the_fix(
    bouncer: Bouncer, database_url: str, fake: FakeProvider,
) -> None:
    dbname = str(psycopg.conninfo.conninfo_to_dict(database_url)["dbname"])
    done = _run_worker({**_defaults(), "DATABASE_URL": bouncer.url(dbname),
                        "SA_DATABASE_POOLER": "transaction", "SA_LISTEN": "0",
                        "SA_PROVIDER_URL": fake.url}, seconds=6)
    assert done.returncode == 0, done.stderr
    said = {e["event"]: e for e in map(json.loads, done.stderr.splitlines())
            if e["event"].startswith("worker.database_timeouts")}
    assert said["worker.database_timeouts"]["statement_timeout"] == "0"
    assert said["worker.database_timeouts_missing"]["level"] == "warning"
    assert "ALTER ROLE <worker role> SET statement_timeout = '30s'" in \
        said["worker.database_timeouts_missing"]["hint"]


def test_prepared_statements_are_off_when_queries_go_through_a_pooler() -> None:
    direct = make_conninfo(host="db.internal", dbname="sa_core")
    pooled = make_conninfo(host="pgbouncer.internal", port=6432, dbname="sa_core")
    assert Settings.from_env({"DATABASE_URL": direct}).prepared_statements
    assert not Settings.from_env({"DATABASE_URL": pooled,
                                  "SA_DIRECT_DATABASE_URL": direct}).prepared_statements
    assert Settings.from_env({"DATABASE_URL": pooled, "SA_DIRECT_DATABASE_URL": direct,
                              "SA_PREPARED_STATEMENTS": "1"}).prepared_statements
    assert not Settings.from_env({"DATABASE_URL": pooled,
                                  "SA_PREPARED_STATEMENTS": "0"}).prepared_statements
    assert not Settings.from_env({"DATABASE_URL": pooled,
                                  "SA_DATABASE_POOLER": "transaction"}).prepared_statements
    assert Settings.from_env({"DATABASE_URL": pooled,
                              "SA_DATABASE_POOLER": "session"}).prepared_statements


def test_no_timeout_travels_as_a_startup_option_through_a_declared_pooler() -> None:
    direct = make_conninfo(host="db.internal", dbname="sa_core")
    pooled = make_conninfo(host="pgbouncer.internal", port=6432, dbname="sa_core")
    alone = Settings.from_env({"DATABASE_URL": direct})
    assert alone.pooler == "none" and "statement_timeout=30000" in alone.worker_database_url
    for env in ({"SA_DIRECT_DATABASE_URL": direct}, {"SA_DATABASE_POOLER": "session"},
                {"SA_DATABASE_POOLER": "transaction"}):
        behind = Settings.from_env({"DATABASE_URL": pooled, **env})
        assert behind.pooler != "none" and not behind.sends_timeouts
        assert behind.worker_database_url == pooled
    # NOTE: the same direct URL declares nothing; a pooler named explicitly wins.
    assert Settings.from_env({"DATABASE_URL": direct, "SA_DIRECT_DATABASE_URL": direct}).pooler == "none"
    assert Settings.from_env({"DATABASE_URL": pooled, "SA_DIRECT_DATABASE_URL": direct,
                              "SA_DATABASE_POOLER": "none"}).sends_timeouts


def test_wake_ups_sent_through_the_pooler_reach_a_direct_listener(
    bouncer: Bouncer, database_url: str,
) -> None:
    dbname = str(psycopg.conninfo.conninfo_to_dict(database_url)["dbname"])
    sender = WakeupSender(bouncer.url(dbname), interval=0)
    logins = bouncer.logins()
    with psycopg.connect(database_url, autocommit=True) as listener, \
            psycopg.connect(bouncer.url(dbname), autocommit=True) as other:
        listener.execute("LISTEN sa_job_queued")
        try:
            for i in range(12):
                # NOTE: every other send finds the pooler's last-used server session taken by
                # another client's open transaction, so the sender's statements run on two
                # sessions in turn, as under load.
                with other.transaction() if i % 2 else contextlib.nullcontext():
                    if i % 2:
                        other.execute("SELECT 1")
                    sender.job_queued()
                    heard = list(listener.notifies(timeout=5, stop_after=1))
                assert [n.channel for n in heard] == ["sa_job_queued"], f"send {i} not heard"
        finally:
            sender.close()
    assert sender.sent == 12
    # NOTE: one connection for the sender, one for `other`: no send failed and reconnected.
    assert bouncer.logins() - logins == 2
