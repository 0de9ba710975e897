"""Makes `sa-core run-worker` one cooperative process: gevent's monkey-patching, applied first.

Job slots, the heartbeat, the completer and the log flusher are written as threads; patched,
each is a greenlet, and sockets, locks, queues and psycopg's waits yield to the others. One
process then holds thousands of provider calls in flight for a fraction of a millisecond of
CPU each (docs/decisions.md, gevent). The web already runs the same
way under gunicorn's gevent worker.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["patch_for_worker"]


def patch_for_worker(argv: Sequence[str]) -> bool:
    """Monkey-patches the standard library when `argv` runs the worker; True when it did.

    NOTE: must run before psycopg_pool (or anything else) is imported: modules that copy
    `threading.Lock` or `queue.Queue` into their own names at import keep the unpatched ones,
    and a greenlet blocked on a real lock blocks every other greenlet.
    """
    if list(argv[:1]) != ["run-worker"]:
        return False
    from gevent import monkey

    monkey.patch_all()
    return True
