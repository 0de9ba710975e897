"""The cyclic garbage collector's settings for the long-lived processes (worker and web).

PERF: CPython's defaults (700, 10, 10) collect the young generation every 700 container
allocations and the whole heap whenever the survivors have grown by a quarter. A worker holding
10,000 calls keeps some 170,000 tracked objects alive, and a full collection walks every one of
them: a streamed run at 10,000 in flight spent 13 of its 37 s of worker CPU in 3,500
collections (23 full ones of about 0.4 s), almost all of it finding nothing, since a finished
job's objects are freed by reference counting. Objects built at start-up (modules, the app, the
pools) are frozen out of every collection, and the young generation is collected every
`YOUNG` allocations: cyclic garbage is still freed, in fewer and larger rounds.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG", "settle_collector"]

YOUNG = 50_000
# NOTE: a middle collection every 20 young ones (a million allocations), a full one every 10 of
# those, and then only when the survivors grew by a quarter (CPython's own rule).
_MIDDLE = 20
_OLD = 10


def settle_collector() -> None:
    """Freezes what start-up built and raises the thresholds; called once a process is assembled,
    before it takes work."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG, _MIDDLE, _OLD)
