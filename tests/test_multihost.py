"""Faults across hosts: web and worker hosts in network namespaces, PgBouncer, this run's own Postgres.

Every scenario ends with exact counts read from the database: every submitted prompt has exactly
one job and it succeeded (0 lost), none is left queued or running (0 stuck), no prompt has two
jobs or two responses and every success has exactly one ledger row (0 duplicated). Durations
are shrunk through settings (stale after 5 s, heartbeats every 0.5 s, the leader's keepalives
declaring a silent peer dead after 3 s), so the cuts last seconds, not the minute of
bench/multihost.py's `--cut`.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import httpx
import psycopg
import pytest

from jobqueue.core.db import open_pool
from jobqueue.core.tokens import create_token
from tests.helpers import answers, require, wait_for
from tests.hosts import VENV_BIN, Host, Hosts, Process, procfile_command, unavailable

# NOTE: the whole module on one xdist worker (make test's --dist loadgroup), so its
# module-scoped hosts, cluster and pooler start once.
pytestmark = pytest.mark.xdist_group("multihost")
WEB_PORT = 8000
FAST = {
    "SA_HEARTBEAT_INTERVAL": "0.5", "SA_STALE_AFTER": "5", "SA_RECLAIM_INTERVAL": "0.5",
    "SA_POLL_INTERVAL": "0.25", "SA_STUCK_AFTER": "120", "SA_SHUTDOWN_GRACE": "3",
    "SA_LEADER_KEEPALIVE_IDLE": "1", "SA_LEADER_KEEPALIVE_INTERVAL": "1",
    "SA_LEADER_KEEPALIVE_COUNT": "2", "SA_PROVIDER_TIMEOUT": "30", "SA_BACKOFF_BASE": "0.2",
    "SA_BACKOFF_CAP": "1",
}
CLEAN = ("TRUNCATE sa_job_event, sa_ledger, sa_audit, sa_edge, sa_job, sa_entity "
         "RESTART IDENTITY CASCADE")
LEADER = """
SELECT host(a.client_addr) AS address FROM pg_locks l JOIN pg_stat_activity a USING (pid)
 WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = 'sa-core maintenance'
"""
MAINTENANCE_SESSIONS = """
SELECT host(client_addr) AS address, state, backend_start, query, l.granted
  FROM pg_stat_activity a LEFT JOIN pg_locks l ON l.pid = a.pid AND l.locktype = 'advisory'
 WHERE a.application_name = 'sa-core maintenance'
"""
EXACT = {"lost": 0, "stuck": 0, "ended_otherwise": 0, "duplicated_jobs": 0,
         "duplicated_responses": 0, "ledger_mismatches": 0}


class Site:
    """The module's hosts: one web host (gunicorn per Procfile) and three worker hosts."""

    def __init__(self, hosts: Hosts) -> None:
        self.hosts = hosts
        self.web = hosts.add("web")
        self.workers = [hosts.add(f"w{i}") for i in range(1, 4)]
        self.web.spawn(["sh", "-c", f"exec {procfile_command('web')}"],
                       {**hosts.service_env(), **FAST, "PORT": str(WEB_PORT),
                        "PATH": f"{VENV_BIN}:/usr/bin:/bin"}, "gunicorn")
        self.base = f"http://{self.web.address}:{WEB_PORT}"
        wait_for(lambda: answers(f"{self.base}/readyz"), timeout=60, interval=0.1)
        pool = open_pool(hosts.direct_url, name="tests-multihost", max_size=1)
        try:
            self.token = create_token(pool, 1, 10)
        finally:
            pool.close()

    def start_worker(self, host: Host, latency: float, *, listen: bool = True) -> Process:
        return self.hosts.start_worker(host, latency, listen=listen, env=FAST)

    def submit(self, http: httpx.Client, text: str) -> str:
        """POSTs a prompt, retrying through an outage with one Idempotency-Key (never twice)."""
        key = str(uuid.uuid4())
        deadline = time.monotonic() + 60
        while True:
            try:
                answer = http.post("/sa-core/v1/prompt", json={"text": text},
                                   headers={"Idempotency-Key": key})
                if answer.status_code in (200, 202):
                    return str(answer.json()["job_id"])
                assert answer.status_code == 503, answer.text
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"no 202 for {text!r} within 60 s"
            # NOTE: a client's retry pause; nothing to await here but the server's recovery.
            time.sleep(0.2)

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=10,
                            headers={"Authorization": f"Bearer {self.token}"})

    def wait_done(self, expected: int, timeout: float = 60) -> None:
        """Waits until `expected` prompts have all succeeded; on timeout says what is left."""
        def done() -> bool:
            try:
                counts = self.hosts.counts()
            except psycopg.OperationalError:  # the server is restarting
                return False
            return counts["prompts"] == expected and counts["succeeded"] == expected

        try:
            wait_for(done, timeout=timeout, interval=0.2)
        except AssertionError:
            left = self.hosts.sql("SELECT state, attempt, error_kind, worker_claim, count(*) AS n "
                                  "FROM sa_job WHERE state <> 'succeeded' "
                                  "GROUP BY 1, 2, 3, 4 ORDER BY 1")
            raise AssertionError(f"not all {expected} succeeded within {timeout} s: "
                                 f"{self.hosts.counts()}, left: {left}") from None


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    missing = unavailable()
    if missing is not None:
        require(*missing)
    with Hosts() as hosts:
        yield Site(hosts)


@pytest.fixture
def fleet(site: Site) -> Iterator[list[Process]]:
    """The worker processes a test starts; stopped (links restored) and the tables emptied after."""
    started: list[Process] = []
    yield started
    for host in site.workers:
        host.restore()
        for process in host.processes:
            process.stop()
        host.processes.clear()
    site.hosts.sql(CLEAN)


def _claim_of(worker: Process) -> str:
    """The `worker_claim` prefix of a worker process: `<hostname>:<pid>:`."""
    return f"%:{worker.popen.pid}:%"


def _events(process: Process, name: str) -> list[dict[str, object]]:
    found = []
    for line in process.lines():
        if name in line:
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
    return found


def test_a_cut_worker_hosts_jobs_are_finished_by_the_others_and_its_late_finalizes_rejected(
    site: Site, fleet: list[Process],
) -> None:
    cut_host, *others = site.workers
    victim = site.start_worker(cut_host, latency=2.0)
    fleet.extend(site.start_worker(host, latency=2.0) for host in others)
    with site.client() as http:
        for i in range(24):
            site.submit(http, f"cut {i}")
    held = wait_for(lambda: site.hosts.sql(
        "SELECT id, attempt FROM sa_job WHERE state = 'running' AND worker_claim LIKE %s",
        (_claim_of(victim),)), timeout=30, interval=0.05)
    cut_host.cut()
    site.wait_done(24)
    cut_host.restore()
    # NOTE: the victim's provider (on its own loopback) answered during the cut; its finalizes
    # waited in TCP retransmission and reach the server now, where the claim guard refuses them.
    held_ids = {str(row["id"]) for row in held}
    rejected = wait_for(lambda: {e["job_id"] for e in _events(victim, "job.claim_lost")} & held_ids,
                        timeout=60, interval=0.2)
    assert rejected
    counts = site.hosts.counts()
    assert {k: counts[k] for k in EXACT} == EXACT
    assert counts["succeeded"] == 24
    late = site.hosts.sql(
        "SELECT count(*) AS n FROM sa_ledger l JOIN sa_job j ON j.id = l.job_id "
        "WHERE j.id = ANY(%s::uuid[]) AND l.attempt = 1", ([row["id"] for row in held],))
    assert late == [{"n": 0}], "a late finalize of the cut host wrote a ledger row"
    finished_by_others = site.hosts.sql(
        "SELECT count(*) AS n FROM sa_job WHERE id = ANY(%s::uuid[]) AND attempt > 1 "
        "AND worker_claim NOT LIKE %s", ([row["id"] for row in held], _claim_of(victim)))
    assert finished_by_others == [{"n": len(held)}]


def test_another_host_takes_the_leader_role_when_the_leaders_host_is_cut(
    site: Site, fleet: list[Process],
) -> None:
    fleet.extend(site.start_worker(host, latency=0.5) for host in site.workers)
    first = wait_for(lambda: site.hosts.sql(LEADER), timeout=30)[0]["address"]
    (leader_host,) = [h for h in site.workers if h.address == first]
    with site.client() as http:
        for i in range(12):
            site.submit(http, f"leader {i}")
        leader_host.cut()
        cut_at = time.monotonic()
        try:
            successor = wait_for(lambda: [r["address"] for r in site.hosts.sql(LEADER)
                                          if r["address"] != first], timeout=60, interval=0.1)
        except AssertionError:
            sessions = site.hosts.sql(MAINTENANCE_SESSIONS)
            raise AssertionError(f"no other leader than {first} within 60 s: {sessions}") from None
        took = time.monotonic() - cut_at
        for i in range(12):
            site.submit(http, f"after the cut {i}")
    site.wait_done(24)
    leader_host.restore()
    # NOTE: 3 s of keepalives (1 + 1 x 2) plus a lock retry every 0.5 s; production's defaults
    # (20 + 10 x 3) make it about a minute.
    assert took < 20, f"the leader role moved after {took:.1f} s"
    assert successor and successor[0] != first
    counts = site.hosts.counts()
    assert {k: counts[k] for k in EXACT} == EXACT
    assert counts["succeeded"] == 24
    assert len(site.hosts.sql(LEADER)) == 1


HOLD_A_JOB = """
import sys, time, psycopg

conn = psycopg.connect(sys.argv[1], prepare_threshold=None)
conn.execute("SELECT id FROM sa_job WHERE state = 'queued' ORDER BY id LIMIT 1 FOR UPDATE")
print("locked", flush=True)
time.sleep(3600)
"""


def test_a_host_cut_inside_a_transaction_does_not_hold_its_rows_past_the_idle_timeout(
    site: Site, fleet: list[Process],
) -> None:
    cut_host, *others = site.workers
    with site.client() as http:
        for i in range(6):
            site.submit(http, f"locked {i}")
    # NOTE: as a worker cut between its claim's UPDATE and COMMIT: a transaction left open
    # through the pooler, one job row locked, so every other claim skips it (SKIP LOCKED).
    holder = cut_host.spawn([str(VENV_BIN / "python"), "-c", HOLD_A_JOB, site.hosts.pooled_url],
                            {}, "holder")
    wait_for(lambda: "locked" in holder.lines(), timeout=30)
    cut_host.cut()
    fleet.extend(site.start_worker(host, latency=0.1) for host in others)
    # NOTE: Postgres ends the session after idle_in_transaction_session_timeout (5 s here, set on
    # the role as ops/README.md says), which releases the row.
    site.wait_done(6, timeout=30)
    counts = site.hosts.counts()
    assert {k: counts[k] for k in EXACT} == EXACT


@pytest.mark.parametrize("fault", ["pgbouncer", "postgres"])
def test_prompts_survive_a_restart_of_the_pooler_or_the_server(
    site: Site, fleet: list[Process], fault: str,
) -> None:
    fleet.extend(site.start_worker(host, latency=0.3, listen=(i != 0))
                 for i, host in enumerate(site.workers[:2]))
    restart: Callable[[], None] = (site.hosts.bouncer.restart if fault == "pgbouncer"
                                   else site.hosts.cluster.restart)
    submitted = threading.Event()
    errors: list[BaseException] = []

    def submit_all() -> None:
        try:
            with site.client() as http:
                for i in range(40):
                    site.submit(http, f"{fault} {i}")
                    if i == 10:
                        submitted.set()
        except BaseException as exc:  # handed to the test's thread
            errors.append(exc)
            submitted.set()

    thread = threading.Thread(target=submit_all)
    thread.start()
    submitted.wait(60)
    restart()
    thread.join(120)
    assert not errors, errors
    site.wait_done(40, timeout=90)
    counts = site.hosts.counts()
    assert {k: counts[k] for k in EXACT} == EXACT
    assert counts["succeeded"] == 40
