"""Under gevent (the worker, the web), a pool's statements go out without waiting on other greenlets."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import REPO

PIPELINES = 20

# NOTE: run in a process of its own: the test process must not be monkey-patched. A second
# greenlet stands for a worker's job greenlets: its socket is always readable, so it runs at every
# round of the hub, and each time holds the process for 30 ms (an unpatched sleep), far longer
# than the server takes to answer, and counts the round.
_SCRIPT = """
from gevent import monkey
monkey.patch_all()
import json, socket, sys
import gevent
import gevent.socket
import psycopg
from jobqueue.core.db import open_pool

hold = monkey.get_original("time", "sleep")
rounds = 0
always, peer = socket.socketpair()
peer.send(b"x")

def busy():
    global rounds
    while True:
        gevent.socket.wait_read(always.fileno())
        hold(0.03)
        rounds += 1

pool = open_pool(sys.argv[1], name="green", max_size=2)
gevent.spawn(busy)
gevent.sleep(0)
out = {}
with pool.connection() as conn:
    start = rounds
    for n in range(int(sys.argv[2])):
        with conn.pipeline():
            conn.execute("SELECT set_config('enable_sort', 'off', true)")
            cur = conn.execute("SELECT current_setting('enable_sort') AS sort, %s::int AS n", (n,))
        row = cur.fetchone()
    out["rounds"] = rounds - start
    out["row"] = row
    try:
        conn.execute("SELECT 1 / %s::int", (0,))
    except psycopg.errors.DivisionByZero as exc:
        out["error"] = type(exc).__name__
    out["after"] = conn.execute("SELECT 2 AS two").fetchone()
    conn.execute("LISTEN sa_green_wait")
    with psycopg.connect(sys.argv[1], autocommit=True) as other:
        other.execute("NOTIFY sa_green_wait, 'hello'")
    out["heard"] = [n.payload for n in conn.notifies(timeout=5, stop_after=1)]
print(json.dumps(out))
"""


def test_a_pipelines_statements_wait_on_the_hub_only_for_their_answers(database_url: str) -> None:
    done = subprocess.run([sys.executable, "-c", _SCRIPT, database_url, str(PIPELINES)],
                          capture_output=True, text=True, timeout=120, cwd=REPO, check=True)
    out = json.loads(done.stdout.splitlines()[-1])
    # A pipeline (settings, statement, sync) waits on the hub only for its answers: two rounds
    # of the other greenlet at most. psycopg's own waits also went round the hub before each
    # statement was sent: seven rounds a pipeline here, the server session idle in ClientRead
    # between its statements meanwhile.
    assert out["rounds"] <= 3 * PIPELINES, out
    assert out["row"] == {"sort": "off", "n": PIPELINES - 1}
    assert out["error"] == "DivisionByZero"
    assert out["after"] == {"two": 2}
    assert out["heard"] == ["hello"]
