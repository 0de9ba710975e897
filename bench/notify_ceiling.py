"""The NOTIFY ceiling: enqueue and finalize commit rates with and without notifications, in one run.

Usage: .venv/bin/python -m bench.notify_ceiling [--clients 8] [--seconds 5] [--intervals 0,0.01,0.05]

Postgres serialises notifying commits on one lock held through the commit's WAL flush. This
measures what that costs the two commits every job makes besides its claim, on a scratch
database with one listener draining both channels (as a worker and an SSE hub would):
- enqueue: `--clients` threads, each on its own connection, run the enqueue statement
  (PROMPT_INSERT_WITH_JOB) back to back, one commit each;
- finalize: the same number of threads run the success finalize (JOB_SET_STATE_IF_RUNNING_MANY)
  one job per commit, the worst case for the completer (an idle worker finishes jobs one by one).
Modes, each on the same schema:
- `trigger NOTIFY`: a trigger of the bench's on sa_job notifies both channels inside every
  writing commit, as 0005_notify_channels.sql's trigger did (main before 0006; since 0017 the
  schema's event trigger is another, so re-applying 0005 would notify nothing);
- `no NOTIFY`: the schema as it is (no notification at all: the ceiling's absence, and what
  SA_LISTEN=0 setups get);
- `coalesced, interval X`: the schema plus one jobqueue.core.wakeup.WakeupSender shared by the
  threads (as in one process), told of every commit: what the code does (SA_NOTIFY_INTERVAL=X).
Each row also shows how many notifications the listener received per second.
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from bench.common import format_table, scratch_database
from jobqueue.core.queries import entity as entity_q
from jobqueue.core.queries import job as job_q
from jobqueue.core.wakeup import WakeupSender
from jobqueue.engine.finalize import BATCH_COLUMNS

NOTIFY_IN_COMMIT = """
CREATE FUNCTION bench_notify_in_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('sa_job_event', '');
    IF TG_OP = 'INSERT' THEN
        PERFORM pg_notify('sa_job_queued', '');
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER bench_notify_in_commit AFTER INSERT OR UPDATE ON sa_job
    FOR EACH STATEMENT EXECUTE FUNCTION bench_notify_in_commit();
"""
NO_NOTIFY = """
DROP TRIGGER IF EXISTS bench_notify_in_commit ON sa_job;
DROP FUNCTION IF EXISTS bench_notify_in_commit();
"""
SETUP_JOBS = """
WITH prompt AS (
    INSERT INTO sa_entity (id, kind, org_id, created_by, correlation_id, content)
    SELECT g, 'prompt', 1, 1, g, 'x' FROM (SELECT gen_random_uuid() AS g
                                             FROM generate_series(1, %s)) s
    RETURNING id
), job AS (
    INSERT INTO sa_job (id, prompt_id, org_id, created_by)
    SELECT gen_random_uuid(), id, 1, 1 FROM prompt
    RETURNING id
)
SELECT id FROM job
"""
CLAIM_ALL = ("UPDATE sa_job SET state = 'running', worker_claim = 'bench', claimed_at = now(), "
             "started_at = now(), running_heartbeat_at = now() WHERE id = ANY(%s)")


class Listener:
    """One LISTEN connection on both channels, counting what it hears."""

    def __init__(self, url: str) -> None:
        self.heard = 0
        self._stop = threading.Event()
        self._conn = psycopg.connect(url, autocommit=True)
        self._conn.execute("LISTEN sa_job_event")
        self._conn.execute("LISTEN sa_job_queued")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for _ in self._conn.notifies(timeout=0.2):
                self.heard += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._conn.close()


def _enqueue_params() -> dict[str, Any]:
    return {"parent_id": None, "org_id": 1, "user_id": 1, "token_hash": None, "text": "bench",
            "priority": 50, "max_attempts": 3, "options": Jsonb({}), "max_queued": 0,
            "idempotency_key": None, "request_hash": None, "key_ttl": 86400,
            "prompt_id": uuid.uuid4(), "job_id": uuid.uuid4(), "run_at": None,
            "delay_seconds": None, "after": None, "max_chain_depth": 1000}


def _finalize_params(job_id: uuid.UUID) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(BATCH_COLUMNS)
    row.update(job_id=job_id, claim="bench", attempt=1, to_state="succeeded", model="m",
               tokens_in=1, tokens_out=1, latency_ms=1, http_status=200,
               response_id=uuid.uuid4(), content="answer", spend_attempt=True)
    return {name: [value] for name, value in row.items()}


def _run_threads(url: str, clients: int, seconds: float,
                 step: Callable[[psycopg.Connection[Any], int, int], bool]) -> int:
    """Runs `step(conn, thread, n)` in `clients` threads until `seconds` pass; returns total steps."""
    counts = [0] * clients
    errors: list[Exception] = []
    start = threading.Barrier(clients + 1)
    stop = threading.Event()

    def loop(k: int) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            start.wait()
            try:
                while not stop.is_set() and step(conn, k, counts[k]):
                    counts[k] += 1
            except Exception as exc:
                # NOTE: a thread that died would otherwise be printed as a rate of 0.
                errors.append(exc)

    threads = [threading.Thread(target=loop, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} of {clients} threads failed") from errors[0]
    return sum(counts)


def measure(url: str, args: argparse.Namespace, sender: WakeupSender | None) -> dict[str, float]:
    """Enqueue and finalize rates (commits/s) and notifications heard per second, for one mode."""
    listener = Listener(url)
    out: dict[str, float] = {}

    def enqueue(conn: psycopg.Connection[Any], k: int, n: int) -> bool:
        conn.execute(entity_q.PROMPT_INSERT_WITH_JOB, _enqueue_params())
        if sender is not None:
            sender.job_queued()
        return True

    heard = listener.heard
    out["enqueue"] = _run_threads(url, args.clients, args.seconds, enqueue) / args.seconds
    out["enqueue_heard"] = (listener.heard - heard) / args.seconds

    per_thread = int(out["enqueue"] * args.seconds * 2 / args.clients) + 100
    with psycopg.connect(url, autocommit=True) as conn:
        ids = [r[0] for r in conn.execute(SETUP_JOBS, (per_thread * args.clients,)).fetchall()]
        conn.execute(CLAIM_ALL, (ids,))
    slices = [ids[k::args.clients] for k in range(args.clients)]

    def finalize(conn: psycopg.Connection[Any], k: int, n: int) -> bool:
        if n >= len(slices[k]):
            return False
        conn.execute(job_q.JOB_SET_STATE_IF_RUNNING_MANY, _finalize_params(slices[k][n]))
        if sender is not None:
            sender.job_changed()
        return True

    time.sleep(0.5)  # NOTE: let the setup's notifications drain before counting
    heard = listener.heard
    out["finalize"] = _run_threads(url, args.clients, args.seconds, finalize) / args.seconds
    out["finalize_heard"] = (listener.heard - heard) / args.seconds
    listener.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--intervals", default="0,0.01,0.05",
                        help="SA_NOTIFY_INTERVAL values for the coalesced mode")
    args = parser.parse_args()
    rows = [["mode", "enqueue/s", "finalize/s", "heard/s (enqueue)", "heard/s (finalize)"]]
    with scratch_database() as url:
        modes: list[tuple[str, str, float | None]] = [
            ("trigger NOTIFY", NOTIFY_IN_COMMIT, None), ("no NOTIFY", NO_NOTIFY, None)]
        modes += [(f"coalesced, interval {x}", NO_NOTIFY, float(x))
                  for x in args.intervals.split(",")]
        for name, trigger, interval in modes:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(trigger)
            sender = None if interval is None else WakeupSender(url, interval)
            got = measure(url, args, sender)
            if sender is not None:
                sender.close()
            rows.append([name, f"{got['enqueue']:,.0f}", f"{got['finalize']:,.0f}",
                         f"{got['enqueue_heard']:,.0f}", f"{got['finalize_heard']:,.0f}"])
            print(f"{name}: {got}", flush=True)
    print(f"\n{args.clients} client threads, each on its own connection, one commit per "
          f"enqueue or finalize, {args.seconds:g} s per figure; one listener on both channels")
    print(format_table(rows, left=1))


if __name__ == "__main__":
    main()
