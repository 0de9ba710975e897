"""The collector's settings: start-up objects frozen, cyclic garbage still freed without a call."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# NOTE: in a child process, so the freeze and thresholds never reach the test session's own.
_CHILD = textwrap.dedent("""
    import gc, weakref
    from jobqueue.runtime.collector import YOUNG, settle_collector

    class Node:
        pass

    settle_collector()
    assert gc.get_freeze_count() > 0, "start-up objects not frozen"
    assert gc.get_threshold()[0] == YOUNG
    freed = []
    for i in range(200):
        a, b = Node(), Node()
        a.other, b.other = b, a
        weakref.finalize(a, freed.append, i)
        del a, b
    assert not freed, "a cycle freed before any collection: the test shows nothing"
    # NOTE: kept alive, since a collection follows allocations minus deallocations: enough for
    # several young collections, none asked for.
    kept = [[] for _ in range(YOUNG * 3)]
    print(len(freed), len(kept))
""")


def test_a_settled_process_frees_cyclic_garbage_by_itself() -> None:
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.split()[0] == "200"
