"""The worker loop: claim as many jobs as there are free slots, hand them to job threads, heartbeat them.

`sa-core run-worker` runs it monkey-patched by gevent (jobqueue/runtime/green.py): every job thread is a
greenlet, so a slot costs a few kilobytes and a provider call in flight no CPU while it waits.
Embedded unpatched (the tests do), the same code runs on OS threads.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from functools import partial

import psycopg
import structlog
from psycopg_pool import ConnectionPool

from jobqueue.core import metrics
from jobqueue.core.db import DictConnection
from jobqueue.engine import presence
from jobqueue.engine.claim import ClaimedJob, ClaimRound, claim_round, next_due
from jobqueue.engine.departures import DepartureWatch
from jobqueue.engine.heartbeat import heartbeat, release
from jobqueue.engine.spend import HeldOrgs
from jobqueue.runtime.completer import FinishTimeout
from jobqueue.runtime.due_times import DueTimes
from jobqueue.runtime.executor import Executor, Outcome
from jobqueue.runtime.run_control import RunControl
from jobqueue.runtime.worker_config import WorkerConfig

__all__ = ["Worker", "new_worker_id"]

# PERF: claim rounds in flight at once: slots freed while a claim waits on the database are
# claimed by the other round instead of after it. The second round claims only when at least
# _SECOND_ROUND_LEAST slots are free (the first, for any): with thousands of calls in flight a claim
# takes hundreds of jobs and lasts 100 ms or more, and a second round keeps freed slots filled
# meanwhile; with a few dozen slots a second round only split the claims in two, more and smaller
# statements, and full jobs burned down 11-14 % slower than with one (docs/performance.md).
_CLAIMERS = 2
_SECOND_ROUND_LEAST = 64

log = structlog.get_logger(__name__)


def new_worker_id() -> str:
    """Returns an id naming host and pid (for operators) plus randomness (unique across restarts)."""
    return f"{socket.gethostname()[:32]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


@dataclass
class _Run:
    job: ClaimedJob
    control: RunControl


class Worker:
    """One worker process's engine; `run()` blocks until `stop()` (or one round with `once`).

    Shutdown order: stop claiming, let in-flight jobs finish within `shutdown_grace`, put the
    rest back to `queued` (no attempt spent), stop the heartbeat. The caller closes the pool.
    """

    def __init__(
        self,
        pool: ConnectionPool[DictConnection],
        executor: Executor,
        config: WorkerConfig,
        worker_id: str | None = None,
    ) -> None:
        self.pool = pool
        self.executor = executor
        self.config = config
        self.worker_id = worker_id or new_worker_id()
        self.log = log.bind(worker_id=self.worker_id)
        self._inflight: dict[uuid.UUID, _Run] = {}
        self._finishing: set[uuid.UUID] = set()
        self._lock = threading.Lock()
        # NOTE: one per claim loop, so a loop clearing its own never swallows another's wake-up.
        self._wakes = tuple(threading.Event() for _ in range(_CLAIMERS))
        # NOTE: the free slots each loop needs to claim; a loop is woken by a freed slot only then.
        self._leasts = (1, *[min(_SECOND_ROUND_LEAST, config.claim_limit)] * (_CLAIMERS - 1))
        self._idle = threading.Condition(self._lock)
        self._stopping = threading.Event()
        # NOTE: the due times heard of (time.monotonic()), soonest first, so a job due sooner than
        # one heard of earlier does not make the worker forget the later one.
        self._dues = DueTimes()
        self._departures = DepartureWatch(self.worker_id)
        self._runs: queue.SimpleQueue[_Run | None] = queue.SimpleQueue()
        self._runners: list[threading.Thread] = []
        self._idle_runners = 0
        # NOTE: free slots that a claim round in flight may fill; no other round counts them.
        self._claiming = 0
        # PERF: whether claimable jobs may be waiting: the last round took all it could or was
        # contended, or a wake-up came since it began (`_heard` counts them). Only then does a
        # freed slot start a round: slots freeing onto an empty queue ran 2.6 claims a job at
        # 20 jobs/s and 1.6 at 200/s, against 1.0 and 0.5 now (docs/performance.md).
        self._may_wait = True
        self._heard = 0
        self._claimers: list[threading.Thread] = []
        # NOTE: counters for operators and tests (River's TestSignals idea), read without a lock.
        self.claim_rounds = 0
        self.claim_failures = 0
        self.departure_looks = 0
        # NOTE: the orgs past their budget are re-read at most once per poll interval (1 s at most).
        self._held = HeldOrgs(pool, config.budgets, ttl=min(config.poll_interval, 1.0))

    def _wake_all(self) -> None:
        for wake in self._wakes:
            wake.set()

    def _wake_for(self, free: int) -> None:
        """Wakes the loops that claim for `free` slots, when jobs may be waiting.

        PERF: a freed slot woke every loop, and the second, finding too few slots, went back
        to sleep: two thread switches a job for nothing in a burn-down."""
        if not self._may_wait:
            return
        for wake, least in zip(self._wakes, self._leasts, strict=True):
            if free >= least:
                wake.set()

    def _heard_of_jobs(self) -> None:
        """Notes that jobs may be waiting and wakes the first loop, and the others while a round
        is in flight (its statement may have begun before the jobs were written)."""
        with self._lock:
            self._heard += 1
            self._may_wait = True
            claiming = self._claiming > 0
        for wake in self._wakes if claiming else self._wakes[:1]:
            wake.set()

    def stop(self) -> None:
        """Asks `run()` to stop claiming and shut down; safe from a signal handler."""
        self._stopping.set()
        self._wake_all()

    def wake(self) -> None:
        """Ends the current wait early, so the worker claims now."""
        with self._lock:
            self._may_wait = True
        self._wake_all()

    def on_job_queued(self, payload: str) -> None:
        """Reacts to a `sa_job_queued` notification: claim now, or remember when a delayed job is due.

        Args:
            payload: empty when the job is claimable now, else its scheduled_for in epoch seconds.
        """
        if not payload:
            self._heard_of_jobs()
            return
        self._dues.expect(time.monotonic() + float(payload) - time.time())
        # NOTE: the sleeping loop recomputes its deadline only when woken.
        self._wakes[0].set()

    @property
    def inflight(self) -> int:
        """Jobs this worker is running right now."""
        with self._lock:
            return len(self._inflight)

    def run(self, once: bool = False) -> None:
        """Claims and runs jobs until stopped; with `once`, one claim round run to completion."""
        self.log.info("worker.started", concurrency=self.config.concurrency, once=once)
        self._say_present(prune=True)
        heartbeat = threading.Thread(target=self._heartbeat_loop, name="sa-heartbeat", daemon=True)
        heartbeat.start()
        # NOTE: the watch's first look places its cursor before the first claim: a job claimed
        # after it leaves `running` by a later event. Should it fail, the loop places it later
        # and the heartbeat covers the jobs claimed meanwhile.
        self._watch_safely()
        watch = threading.Thread(target=self._departure_loop, name="sa-departures", daemon=True)
        watch.start()
        try:
            if once:
                self._claim_round()
                while not self._stopping.is_set() and not self._wait_idle(0.2):
                    pass
            else:
                self._claimers = [threading.Thread(target=self._loop, args=(n,), daemon=True,
                                                   name=f"sa-claim-{n}")
                                  for n in range(1, _CLAIMERS)]
                for claimer in self._claimers:
                    claimer.start()
                self._loop()
        finally:
            self._shutdown()
            heartbeat.join(timeout=5)
            watch.join(timeout=5)
            self._say_gone()
        # NOTE: the database round trips this worker made, for operators and bench/throughput.py.
        self.log.info("worker.stopped", claims=self.claim_rounds,
                      finalize_batches=self.executor.completer.batches)

    def _loop(self, index: int = 0) -> None:
        """Claim rounds until stopped; only the first loop asks when scheduled jobs fall due."""
        wake, leading = self._wakes[index], index == 0
        least = self._leasts[index]
        if leading:
            self._learn_next_due()
        while not self._stopping.is_set():
            try:
                full = self._claim_round(least)
            except psycopg.Error as exc:
                # NOTE: the claim sets apart a job it cannot write (engine/claim.py); what is left
                # is the database's trouble, which the next round, a poll later, tries again.
                self.claim_failures += 1
                self.log.warning("worker.claim_failed", error=str(exc).strip(),
                                 error_type=type(exc).__name__)
                full = False
            if full and not self._stopping.is_set():
                continue
            sleep = self._dues.sleep_for(time.monotonic(), self.config.poll_interval)
            if not wake.wait(sleep) and leading:
                self._learn_next_due()
            wake.clear()

    def _learn_next_due(self) -> None:
        """Asks the database when the next scheduled job falls due, so it starts on time even when
        its wake-up was never heard (sent before this worker listened, or lost)."""
        try:
            due = next_due(self.pool, self.config.priority_ceiling)
        except psycopg.Error as exc:
            self.log.warning("worker.next_due_failed", error=str(exc).strip())
            return
        if due is not None:
            self._dues.expect(time.monotonic() + due)

    def _busy_slots(self) -> int:
        """Slots taken: jobs held, less those past their provider call (up to one per slot).

        PERF: a job whose call is over waits for its batched finalize; its slot takes the next
        job meanwhile, so --concurrency bounds provider calls in flight, not finalize waits. The
        cap keeps a slow database from letting held jobs grow past twice the concurrency.
        """
        with self._lock:
            return self._busy_slots_locked()

    def _busy_slots_locked(self) -> int:
        return len(self._inflight) - min(len(self._finishing), self.config.concurrency)

    def _free_slots_locked(self) -> int:
        """Slots neither busy nor counted by a claim round in flight."""
        return self.config.concurrency - self._busy_slots_locked() - self._claiming

    def report_slots(self) -> None:
        """Sets `sa_worker_slots`: busy (held, call not yet returned) and free (claimable now)."""
        busy = min(self._busy_slots(), self.config.concurrency)
        metrics.WORKER_SLOTS.labels(state="busy").set(busy)
        metrics.WORKER_SLOTS.labels(state="free").set(self.config.concurrency - busy)

    def _call_returned(self, job_id: uuid.UUID) -> None:
        with self._lock:
            if job_id in self._inflight:
                self._finishing.add(job_id)
            free = self._free_slots_locked()
        self._wake_for(free)

    def _claim_round(self, least: int = 1) -> bool:
        """Claims for the free slots when at least `least` are free; True when it filled them all
        (more may be waiting)."""
        # NOTE: every route this worker calls is paused: a claim would only put jobs back.
        if self.executor.gate.all_paused(list(self.executor.providers.routes.routes)):
            return False
        with self._lock:
            limit = min(self._free_slots_locked(), self.config.claim_limit)
            if limit < least:
                return False
            self._claiming += limit
            heard = self._heard
        taken: ClaimRound | None = None
        try:
            taken = claim_round(self.pool, self.worker_id, limit, self.config.priority_ceiling,
                                self.config.org_max_running, self.config.priority_aging,
                                held_orgs=self._held.current(),
                                token_window=self.config.token_window)
        finally:
            runs = [_Run(job, RunControl(partial(self._call_returned, job.id)))
                    for job in (taken.jobs if taken else ())]
            # NOTE: the slots pass from the round to its jobs at once, so no other round sees
            # them free in between.
            with self._lock:
                self._claiming -= limit
                if taken is not None:
                    self.claim_rounds += 1
                    self._may_wait = (taken.chosen == limit or len(runs) < taken.chosen
                                      or self._heard != heard)
                self._inflight.update((run.job.id, run) for run in runs)
        for run in runs:
            with self._lock:
                start_runner = self._idle_runners == 0
                if not start_runner:
                    self._idle_runners -= 1
            if start_runner:
                self._start_runner()
            self._runs.put(run)
        return len(runs) == limit

    def _start_runner(self) -> None:
        """Adds a job thread; called only when none is idle.

        PERF: job threads outlive their jobs, so a job costs no thread start; a provider
        connection goes from call to call, whichever thread makes it (provider.py), so threads
        waiting on their finalize hold none. An abandoned job's thread stays busy until its cut call
        returns (at once, unless the provider's connect is still pending), so the pool may grow
        past `concurrency` by the number of such calls.
        """
        runner = threading.Thread(target=self._runner_loop, name=f"sa-job-{len(self._runners)}",
                                  daemon=True)
        self._runners.append(runner)
        runner.start()

    def _runner_loop(self) -> None:
        while (run := self._runs.get()) is not None:
            self._run_job(run)

    def _run_job(self, run: _Run) -> None:
        try:
            self.executor.run_claimed(run.job, run.control)
        except FinishTimeout:
            # NOTE: no second finalize to queue behind a wedged writer: without heartbeats the
            # job goes stale and the reclaimer requeues it.
            self.log.error("job.finalize_timeout", job_id=str(run.job.id))
        except Exception as exc:
            self.log.exception("job.run_error", job_id=str(run.job.id))
            try:
                self.executor.fail_unexpected(run.job, exc)
            except Exception:
                self.log.exception("job.finalize_error", job_id=str(run.job.id))
        finally:
            self._release_slot(run, runner_idle=True)

    def _release_slot(self, run: _Run, runner_idle: bool = False) -> None:
        """Frees the job's slot; `runner_idle` when its thread is done with it too."""
        with self._lock:
            if runner_idle:
                self._idle_runners += 1
            if self._inflight.get(run.job.id) is run:
                del self._inflight[run.job.id]
                self._finishing.discard(run.job.id)
            self._idle.notify_all()
            free = self._free_slots_locked()
        self._wake_for(free)

    def _wait_idle(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._inflight:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    def heartbeat_once(self) -> int:
        """Refreshes the heartbeat of every job in flight in one UPDATE; abandons the ones lost.

        Returns:
            How many jobs were abandoned.
        """
        with self._lock:
            snapshot = dict(self._inflight)
        if not snapshot:
            return 0
        alive = heartbeat(self.pool, self.worker_id,
                          {job_id: run.job.org_id for job_id, run in snapshot.items()})
        return self._abandon([run for run in snapshot.values()
                              if (run.job.id, run.job.attempt) not in alive], "heartbeat")

    def watch_departures_once(self) -> int:
        """Cuts the calls of the jobs taken from this worker since the last look (cancelled,
        reclaimed, changed by SQL), read from the event log in one pass whatever the jobs held.

        Returns:
            How many calls were cut.
        """
        gone = self._departures.departed(self.pool, self._attempt_calling)
        self.departure_looks += 1
        with self._lock:
            runs = [run for job_id, attempt in gone.items()
                    if (run := self._inflight.get(job_id)) is not None
                    and run.job.attempt == attempt]
        return self._abandon(runs, "event_log")

    def _attempt_calling(self, job_id: uuid.UUID) -> int | None:
        """The attempt of the job's call in flight; None once it returned or was never ours."""
        with self._lock:
            run = self._inflight.get(job_id)
            if run is None or job_id in self._finishing:
                return None
            return run.job.attempt

    def _abandon(self, runs: list[_Run], found_by: str) -> int:
        """Abandons the runs whose jobs are no longer ours (their calls are cut) and frees
        their slots; one log line each. Returns how many were abandoned.

        NOTE: a job whose finalize began meanwhile is not lost: it may just have committed; its
        own guarded write tells.
        """
        lost = [run for run in runs if run.control.abandon()]
        for run in lost:
            self.log.warning("job.claim_lost", job_id=str(run.job.id), attempt=run.job.attempt,
                             found_by=found_by)
            self._release_slot(run)
        return len(lost)

    def _heartbeat_loop(self) -> None:
        while not self._stopping.wait(self.config.heartbeat_interval):
            try:
                self.heartbeat_once()
            except Exception:
                self.log.exception("worker.heartbeat_failed")
            self._say_present()

    def _say_present(self, prune: bool = False) -> None:
        """Tells operators this worker runs (sa_worker); their view, never the work, needs it."""
        try:
            presence.seen(self.pool, self.worker_id, self.config.concurrency, self.inflight,
                          prune_after=(presence.STALE_AFTER_BEATS * self.config.heartbeat_interval
                                       if prune else None))
        except psycopg.Error as exc:
            self.log.warning("worker.presence_failed", error=str(exc).strip()[:300])

    def _say_gone(self) -> None:
        try:
            presence.gone(self.pool, self.worker_id)
        except psycopg.Error as exc:
            self.log.warning("worker.presence_failed", error=str(exc).strip()[:300])

    def _watch_safely(self) -> None:
        try:
            self.watch_departures_once()
        except psycopg.Error as exc:
            # NOTE: the database's trouble: the next look retries, the heartbeat still covers.
            self.log.warning("worker.departure_watch_failed", error=str(exc).strip(),
                             error_type=type(exc).__name__)
        except Exception:
            self.log.exception("worker.departure_watch_failed")

    def _departure_loop(self) -> None:
        """Looks for departed jobs every `cancel_check_interval` until the worker stops.

        PERF: three constant-cost statements per look per worker (jobqueue/engine/departures.py),
        plus one probe by id when a job it holds appears there.
        """
        while not self._stopping.wait(self.config.cancel_check_interval):
            self._watch_safely()

    def _shutdown(self) -> None:
        self._stopping.set()
        self._wake_all()
        # NOTE: a round in flight still adds its jobs, which the release below then covers.
        for claimer in self._claimers:
            claimer.join()
        try:
            self._finish_in_flight()
        finally:
            for _ in self._runners:
                self._runs.put(None)

    def _finish_in_flight(self) -> None:
        if self._wait_idle(self.config.shutdown_grace):
            return
        with self._lock:
            leftovers = list(self._inflight.values())
        for run in leftovers:
            run.control.abandon()
        released = release(self.pool, self.worker_id)
        self.log.warning("worker.released", jobs=released, outcome=Outcome.ABANDONED.value)
