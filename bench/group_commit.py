"""What a prompt costs Postgres written alone and in a group: PROMPT_INSERT_WITH_JOB against
PROMPT_INSERT_WITH_JOB_MANY of 2, 4 and 8 prompts (jobqueue/engine/submit_group.py).

Usage: .venv/bin/python -m bench.group_commit [--prompts 4000]

One connection, one statement after another, on a scratch database; per prompt: the CPU of the
connection's Postgres backend (read from /proc, so the server must be local), this process's CPU
(the client's share: parameters, protocol) and the wall time. The one-prompt statement runs
first and last, so a drift of the machine between the two shows.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable
from typing import Any

from psycopg.types.json import Jsonb

from bench.common import format_table, scratch_database
from bench.enqueue_rates import _proc_cpu
from jobqueue.core.db import DictConnection, open_pool
from jobqueue.core.queries import entity as q

_COMMON: dict[str, Any] = {"org_id": 1, "user_id": 1, "max_queued": 0, "idempotency_key": None,
                           "request_hash": None, "key_ttl": 86400}


def _one(conn: DictConnection) -> None:
    conn.execute(q.PROMPT_INSERT_WITH_JOB, {
        **_COMMON, "parent_id": None, "text": "bench", "priority": 50, "max_attempts": 3,
        "options": Jsonb({}), "run_at": None, "delay_seconds": None, "after": None,
        "max_chain_depth": 10, "prompt_id": uuid.uuid4(), "job_id": uuid.uuid4()}).fetchone()


def _many(conn: DictConnection, n: int) -> None:
    conn.execute(q.PROMPT_INSERT_WITH_JOB_MANY, {
        **_COMMON, "parent_ids": [None] * n, "texts": ["bench"] * n, "priorities": [50] * n,
        "max_attempts": [3] * n, "options": ["{}"] * n, "run_ats": [None] * n,
        "delays": [None] * n, "prompt_ids": [uuid.uuid4() for _ in range(n)],
        "job_ids": [uuid.uuid4() for _ in range(n)]}).fetchone()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=4000, help="written per row of the table")
    args = parser.parse_args()
    with scratch_database() as url:
        pool = open_pool(url, name="bench-group", max_size=1)
        try:
            with pool.connection() as conn:
                backend = conn.info.backend_pid
                cases: list[tuple[str, int, Callable[[], None]]] = [
                    ("PROMPT_INSERT_WITH_JOB", 1, lambda: _one(conn)),
                    *((f"PROMPT_INSERT_WITH_JOB_MANY, {n}", n, lambda n=n: _many(conn, n))
                      for n in (2, 4, 8)),
                    ("PROMPT_INSERT_WITH_JOB again", 1, lambda: _one(conn))]
                for _, _, write in cases:  # NOTE: warm-up: prepared statements, caches
                    for _ in range(100):
                        write()
                lines = [["statement", "Postgres CPU us/prompt", "client CPU us/prompt",
                          "wall us/prompt"]]
                for name, size, write in cases:
                    rounds = args.prompts // size
                    pg0 = _proc_cpu([backend]).get(backend, 0.0)
                    cpu0, wall0 = time.process_time(), time.perf_counter()
                    for _ in range(rounds):
                        write()
                    done = rounds * size
                    lines.append([name,
                                  f"{(_proc_cpu([backend]).get(backend, 0.0) - pg0) / done * 1e6:.0f}",
                                  f"{(time.process_time() - cpu0) / done * 1e6:.0f}",
                                  f"{(time.perf_counter() - wall0) / done * 1e6:.0f}"])
        finally:
            pool.close()
    print(format_table(lines, left=1))


if __name__ == "__main__":
    main()
