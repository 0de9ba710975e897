"""Chaos run: workers SIGKILLed at random while the provider fails in every way; then check invariants.

Usage: .venv/bin/python -m bench.chaos [--jobs 5000] [--workers 4] [--kills 20] [--seed 1]

Prints the counts it checks: every job terminal, one response entity and one flows-to edge per
succeeded job, no attempt beyond max_attempts, every transition in sa_job_event legal.
"""

from __future__ import annotations

import argparse
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import psycopg
from psycopg.rows import dict_row

from bench.common import VENV_BIN, scratch_database, spawn, wait_http
from jobqueue.core.states import JobState, is_legal

# NOTE: a mix of every failure the fake provider can inject; weights favour plain successes.
MIX = [
    ("plain {n}", 60),
    ("flaky {n} [fake:flaky=1]", 10),
    ("rate limited {n} [fake:429=0.2]", 8),
    ("down {n} [fake:503]", 6),
    ("slow {n} [fake:latency=0.3]", 8),
    ("hangs {n} [fake:hang]", 4),
    ("rejected {n} [fake:400]", 4),
]

BACKLOG = """
WITH p AS (
    INSERT INTO sa_entity (id, kind, org_id, created_by, correlation_id, content)
    SELECT g, 'prompt', 1 + (n %% 3), 1, g, t
      FROM (SELECT gen_random_uuid() AS g, n, t FROM unnest(%s::text[]) WITH ORDINALITY AS u(t, n)) s
    RETURNING id, org_id
)
INSERT INTO sa_job (id, prompt_id, org_id, created_by, priority)
SELECT gen_random_uuid(), id, org_id, 1, (random() * 100)::int FROM p
"""

PENDING = "SELECT count(*) AS n FROM sa_job WHERE state IN ('queued', 'running')"

# NOTE: worker ids read host:pid:random, so the pids of workers holding running jobs show here.
BUSY_PIDS = "SELECT DISTINCT split_part(worker_claim, ':', 2) AS pid FROM sa_job WHERE state = 'running'"

CHECKS = """
SELECT
  (SELECT count(*) FROM sa_job) AS jobs,
  (SELECT count(*) FROM sa_job WHERE state = 'succeeded') AS succeeded,
  (SELECT count(*) FROM sa_job WHERE state = 'failed') AS failed,
  (SELECT count(*) FROM sa_job WHERE state NOT IN ('succeeded', 'failed', 'cancelled', 'superseded'))
      AS not_terminal,
  (SELECT count(*) FROM sa_job j WHERE j.state = 'succeeded' AND
      (SELECT count(*) FROM sa_entity r WHERE r.kind = 'response' AND r.parent_id = j.prompt_id) <> 1)
      AS succeeded_without_exactly_one_response,
  (SELECT count(*) FROM sa_job j WHERE j.state = 'succeeded' AND
      (SELECT count(*) FROM sa_edge e WHERE e.to_id = j.response_id AND e.from_id = j.prompt_id
          AND e.kind = 'flows-to') <> 1) AS succeeded_without_exactly_one_edge,
  (SELECT count(*) FROM sa_entity r WHERE r.kind = 'response' AND NOT EXISTS
      (SELECT 1 FROM sa_job j WHERE j.response_id = r.id AND j.state = 'succeeded'))
      AS orphan_responses,
  (SELECT count(*) FROM sa_job WHERE attempt > max_attempts) AS over_max_attempts,
  (SELECT count(*) FROM sa_job_event WHERE to_state = 'running') AS claims,
  (SELECT count(*) FROM sa_job WHERE error_kind = 'worker_crash' OR EXISTS (
      SELECT 1 FROM sa_job_event e WHERE e.job_id = sa_job.id AND e.error_kind = 'worker_crash'))
      AS jobs_reclaimed
"""

TRANSITIONS = "SELECT from_state, to_state, count(*) AS n FROM sa_job_event GROUP BY 1, 2"


@dataclass(frozen=True)
class ChaosReport:
    """What a chaos run found; `ok` when no invariant is broken."""

    counts: dict[str, int]
    illegal_transitions: int
    kills: int
    seconds: float

    @property
    def ok(self) -> bool:
        c = self.counts
        return (c["not_terminal"] == 0 and c["succeeded_without_exactly_one_response"] == 0
                and c["succeeded_without_exactly_one_edge"] == 0 and c["orphan_responses"] == 0
                and c["over_max_attempts"] == 0 and self.illegal_transitions == 0)

    def lines(self) -> list[str]:
        lost = self.counts["not_terminal"]
        duplicated = (self.counts["succeeded_without_exactly_one_response"]
                      + self.counts["orphan_responses"])
        return [f"{name:42} {value}" for name, value in self.counts.items()] + [
            f"{'illegal_transitions':42} {self.illegal_transitions}",
            f"{'workers_killed':42} {self.kills}",
            f"{'seconds':42} {self.seconds:.1f}",
            f"lost={lost} duplicated={duplicated} stuck={lost} illegal={self.illegal_transitions}"
            f" -> {'OK' if self.ok else 'BROKEN'}",
        ]


def worker_env(database_url: str, provider_url: str) -> dict[str, str]:
    """Short durations so reclaim and retries happen within seconds."""
    return {
        "DATABASE_URL": database_url, "SA_PROVIDER_URL": provider_url,
        "SA_PROVIDER_TIMEOUT": "1", "SA_HEARTBEAT_INTERVAL": "0.2", "SA_STALE_AFTER": "1",
        "SA_STUCK_AFTER": "60", "SA_RECLAIM_INTERVAL": "0.3", "SA_POLL_INTERVAL": "0.2",
        "SA_BACKOFF_BASE": "0.05", "SA_BACKOFF_CAP": "1", "SA_RATE_LIMIT_MIN_WAIT": "0.2",
        "SA_SHUTDOWN_GRACE": "1",
        # NOTE: the mix's "rate limited" jobs meet a 429 on every call (a real provider's 429
        # is route-wide and lifts): past 2 s of throttling they spend attempts and end.
        "SA_THROTTLE_MAX_WAIT": "2",
    }


def run_chaos(database_url: str, provider_url: str, *, jobs: int, workers: int, kills: int,
              seed: int, timeout: float, latency: float = 0.0) -> ChaosReport:
    """Enqueues `jobs`, runs `workers` worker processes, SIGKILLs and restarts them `kills` times.

    `latency` (seconds) is added to every provider call, so a small run lasts long enough for
    all its kills to land on busy workers.
    """
    rng = random.Random(seed)
    texts = []
    for n in range(jobs):
        template = rng.choices([t for t, _ in MIX], weights=[w for _, w in MIX])[0]
        texts.append(template.format(n=n) + (f" [fake:latency={latency}]" if latency else ""))
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
        conn.execute(BACKLOG, (texts,))
        if conn.execute(PENDING).fetchone() != {"n": jobs}:
            raise RuntimeError("the backlog was not written")
        env = worker_env(database_url, provider_url)
        command = [sys.executable, "-m", "jobqueue.operator.cli", "run-worker", "--concurrency", "8"]
        procs = [spawn(command, env) for _ in range(workers)]
        started = time.monotonic()
        done = 0
        try:
            while time.monotonic() - started < timeout:
                row = conn.execute(PENDING).fetchone()
                if row is not None and row["n"] == 0 and done >= kills:
                    break
                time.sleep(rng.uniform(0.2, 0.8))
                # NOTE: only a worker holding running jobs is a victim, so every kill strands work.
                busy = {r["pid"] for r in conn.execute(BUSY_PIDS).fetchall()}
                victims = [i for i, proc in enumerate(procs) if str(proc.pid) in busy]
                if done < kills and victims:
                    victim = rng.choice(victims)
                    procs[victim].send_signal(signal.SIGKILL)
                    procs[victim].wait()
                    procs[victim] = spawn(command, env)
                    done += 1
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
        elapsed = time.monotonic() - started
        counts = conn.execute(CHECKS).fetchone()
        assert counts is not None
        illegal = sum(
            r["n"] for r in conn.execute(TRANSITIONS).fetchall()
            if not is_legal(JobState(r["from_state"]) if r["from_state"] else None,
                            JobState(r["to_state"]))
        )
    return ChaosReport(counts=dict(counts), illegal_transitions=illegal, kills=done, seconds=elapsed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--provider-port", type=int, default=8767)
    args = parser.parse_args()
    with scratch_database() as url:
        provider = spawn([str(VENV_BIN / "sa-core"), "fake-provider", "--port", str(args.provider_port)], {})
        try:
            wait_http(f"http://127.0.0.1:{args.provider_port}/healthz")
            report = run_chaos(url, f"http://127.0.0.1:{args.provider_port}", jobs=args.jobs,
                               workers=args.workers, kills=args.kills, seed=args.seed,
                               timeout=args.timeout)
        finally:
            provider.terminate()
            provider.wait(timeout=15)
    print(f"chaos: {args.jobs} jobs, {args.workers} workers, seed {args.seed}")
    print("\n".join(report.lines()))
    sys.exit(0 if report.ok else 1)


if __name__ == "__main__":
    main()
