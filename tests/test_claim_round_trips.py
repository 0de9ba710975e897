"""A claim is one round trip: its plan settings, the org-capped lock and the claim go out in one
pipeline ended by one Sync, and nothing of it stays on the session.

Counted by the client's messages through tests/tcp_proxy.py, not timed: a Sync, a simple Query or a
Flush is where a client may wait for the server, so their number bounds its round trips.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection, open_pool
from jobqueue.core.tokens import Caller
from jobqueue.engine.claim import claim, next_due
from jobqueue.engine.enqueue import enqueue
from tests.helpers import fetch_one
from tests.tcp_proxy import TcpProxy

# NOTE: psycopg prepares a statement on its 6th run on a connection; more runs than that cover
# the claim before and after it is prepared.
RUNS = 8


@pytest.fixture
def proxied_pool(database_url: str, request: pytest.FixtureRequest,
                 ) -> Iterator[tuple[ConnectionPool[DictConnection], TcpProxy]]:
    """A one-connection pool through a counting proxy; `prepare` as a pooler's pool has it (off)
    or as a direct one's (on), by the test's parameter."""
    params = conninfo_to_dict(database_url)
    proxy = TcpProxy(str(params.get("host", "127.0.0.1")), int(params.get("port", 5432)))
    url = make_conninfo(database_url, host="127.0.0.1", port=str(proxy.port), sslmode="disable")
    pool = open_pool(url, name="round-trips", min_size=1, max_size=1, prepare=request.param)
    yield pool, proxy
    pool.close()
    proxy.close()


def _client_port(pool: ConnectionPool[DictConnection]) -> int:
    with pool.connection() as conn, socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
        port: int = sock.getsockname()[1]
    return port


def _wait_points(pool: ConnectionPool[DictConnection], proxy: TcpProxy,
                 work: Callable[[], Any]) -> int:
    """The points at which `work` could wait for the server, on the pool's one connection."""
    seen = proxy.frontend(_client_port(pool))
    before = seen.wait_points
    work()
    return seen.wait_points - before


@pytest.mark.parametrize("proxied_pool", [True, False], indirect=True, ids=["prepared", "pooler"])
@pytest.mark.parametrize("org_max_running, token_window", [(0, 0.0), (RUNS, 0.0), (0, 60.0)],
                         ids=["fair", "org-capped", "by-tokens"])
def test_a_claim_is_one_round_trip_and_leaves_the_session_as_it_was(
    proxied_pool: tuple[ConnectionPool[DictConnection], TcpProxy], pool: ConnectionPool[DictConnection],
    org_max_running: int, token_window: float,
) -> None:
    small, proxy = proxied_pool
    for i in range(RUNS):
        enqueue(pool, Caller(org_id=1 + i % 2, user_id=1), f"round trip {i}")

    claimed = []
    for run in range(RUNS):
        trips = _wait_points(small, proxy, lambda run=run: claimed.extend(  # type: ignore[misc]
            claim(small, f"w{run}", 1, 100, org_max_running=org_max_running,
                  token_window=token_window)))
        assert trips == 1, f"claim {run + 1} could wait {trips} times"

    assert len({job.id for job in claimed}) == RUNS
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_job WHERE state = 'running'")["n"] == RUNS
    with small.connection() as conn:
        assert conn.info.transaction_status == 0
        row = conn.execute("SELECT current_setting('enable_sort') AS sort, "
                           "current_setting('enable_bitmapscan') AS bitmap").fetchone()
    assert row == {"sort": "on", "bitmap": "on"}


@pytest.mark.parametrize("proxied_pool", [True], indirect=True, ids=["prepared"])
def test_an_empty_claim_and_the_next_due_question_are_one_round_trip_each(
    proxied_pool: tuple[ConnectionPool[DictConnection], TcpProxy], pool: ConnectionPool[DictConnection],
) -> None:
    small, proxy = proxied_pool
    enqueue(pool, Caller(org_id=1, user_id=1), "later", delay_seconds=3600)

    assert _wait_points(small, proxy, lambda: claim(small, "idle", 4, 100)) == 1
    due: list[float | None] = []
    assert _wait_points(small, proxy, lambda: due.append(next_due(small, 100))) == 1
    assert due[0] is not None and 3500 < due[0] <= 3600
