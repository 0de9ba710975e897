"""The job lifecycle against the database: every state change of a job is made here, and only here.

Each transition is one statement of jobqueue/core/queries/, run by one function of this package
and guarded in its WHERE clause; the database's triggers refuse an illegal transition and write
the event log, and decide none (jobqueue/sql/functions/). `transitions.record` counts and logs
each one once it has committed.

- created -> queued: `enqueue.enqueue` / `enqueue_many`, PROMPT_INSERT_WITH_JOB(_MANY); parent,
  predecessor and chain depth of the caller's org, the org's queue cap, the idempotency key.
  `submit_group.SubmitGroup` writes concurrent plain submits (none of those guards) of one web
  process with PROMPT_INSERT_WITH_JOB_MANY, one caller per statement.
- created -> queued, a batch's lines: `batch_progress.BatchStep.feed`, BATCH_FEED_MANY; the
  batch locked under the keeper's lease, lines still pending, as many as the org's bulk lane
  has room for (SA_BATCH_MAX_QUEUED, half of SA_ORG_MAX_QUEUED).
- queued -> running: `claim.claim`, JOB_CLAIM_MANY(_ORG_CAPPED) or, around a row it cannot
  write, JOB_CLAIM_IDS; queued, not waiting, due, not quarantined, SKIP LOCKED.
- running -> failed (options it cannot run): `claim.claim`, JOB_REJECT_MANY_IF_CLAIMED.
- running -> succeeded, queued (retry, throttled) or failed: `finalize.finish`, decided there
  from what the worker's call came to (jobqueue/core/attempt.py), JOB_SET_STATE_IF_RUNNING_MANY;
  running under this claim and attempt.
- running -> queued at shutdown: `heartbeat.release`, JOB_RELEASE_MANY_IF_CLAIMED.
- running -> queued or failed when stale or stuck: `reclaim.Reclaimer`,
  JOB_RECLAIM_MANY_IF_CLAIMED_AND_STALE; still under the claim read, still stale at `as_of`.
- queued or running -> cancelled: `control.cancel_job`, JOB_CANCEL_IF_ACTIVE; the caller's org.
- queued or running -> cancelled, a batch's jobs: `batch_progress.BatchStep.cancel_jobs`,
  BATCH_JOBS_CANCEL_MANY; the batch locked under the keeper's lease and cancelling (queued jobs)
  or past its window (running ones too), each line still fed; their chains settled at once.
- finished -> superseded, with a new queued job: `control.retry_job` / `retry_prompt`,
  JOB_RETRY_IF_FINISHED / JOB_RETRY_LATEST_FOR_PROMPT_IF_FINISHED; never superseded before.
- waiting -> due (not a state change): `chains.settle`, JOB_RELEASE_DEPENDENTS_MANY; the
  predecessor succeeded.
- queued -> cancelled as dependency_failed, down a chain: `chains.settle` / `chains.sweep`,
  JOB_CANCEL_DEPENDENTS_MANY, JOB_CANCEL_ORPHANED_MANY; still waiting, predecessor ended or gone.
- cancelled -> superseded, with a new waiting job: `chains.rearm`, in the retry's transaction,
  JOB_REARM_DEPENDENTS; ended by the retried job's end, never re-armed before.

Not a transition, a read: `departures.DepartureWatch` tells each worker which of its jobs left
`running` (any of the above, or operator SQL), JOB_EVENT_LIST_LEFT_RUNNING_AFTER then
JOB_LIST_STILL_CLAIMED; the worker cuts their calls and writes nothing for them.

A batch statement that fails on one row is split around it (`isolation.write_isolated`), and a
row no statement can write is set aside (`quarantine.set_aside`). A Batch API batch's steps run in
`batch_progress.step`, which records their transitions once the step commits; the runtime's
batch keeper only decides which step a batch takes next.
"""
