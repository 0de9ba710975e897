"""Statements of chains (`after`): settle a finished job's waiting dependents, re-arm them on retry.

PERF: each step from a job to the jobs after it is a LATERAL subquery with OFFSET 0, which the
planner cannot flatten into a join (nor an EXISTS with OFFSET 0 into an anti-join): it stays one
probe of sa_job_waiting_idx (or sa_job_after_idx) per job, whatever the statistics say. Written
as a join, a re-arm of 10,000 links read the whole of sa_job_after_idx once per link (170 s) on
a table never analyzed, where the probes take 0.1 s (tests/test_plans.py). For the same reason
each write names its rows in an `id = ANY (ARRAY(...))` the primary key serves, never only in a
join a small table may hash.
"""

__all__ = [
    "JOB_CANCEL_DEPENDENTS_MANY",
    "JOB_CANCEL_ORPHANED_MANY",
    "JOB_LIST_WAITED_ON_PAGE",
    "JOB_REARM_DEPENDENTS",
    "JOB_RELEASE_DEPENDENTS_MANY",
]

# served by sa_job_pkey (id) for the predecessors, sa_job_waiting_idx (after_job_id, id) WHERE
# waiting (0016_engine_chains.sql) for their dependents. A succeeded job's waiting dependents (one
# level: each runs before its own dependents may) become claimable, no sooner than the time they
# were asked to run at, and, unless its prompt names a parent of its own, each continues the
# predecessor's thread: the response becomes its prompt's parent.
# NOTE: guards in the form queries/job.py explains. `waiting` is re-checked by the update, so a
# dependent cancelled meanwhile is left alone. A dependent's prompt counts as parentless when
# num_nulls(parent_id) = 1 (0015_settle_by_predecessor.sql says why not `parent_id IS NULL`).
JOB_RELEASE_DEPENDENTS_MANY = """
WITH pred AS (
    SELECT p.id, p.response_id
      FROM sa_job p
     WHERE p.id = ANY(%(job_ids)s::uuid[]) AND p.state IS NOT DISTINCT FROM 'succeeded'
), dep AS (
    SELECT d.id, d.prompt_id, pred.id AS predecessor, pred.response_id
      FROM pred
     CROSS JOIN LATERAL (SELECT w.id, w.prompt_id FROM sa_job w
                          WHERE w.after_job_id = pred.id AND w.waiting OFFSET 0) AS d
), thread AS (
    UPDATE sa_entity e
       SET parent_id = r.id, causation_id = r.id, correlation_id = r.correlation_id
      FROM dep JOIN sa_entity r ON r.id = dep.response_id
     WHERE e.id = dep.prompt_id AND num_nulls(e.parent_id) = 1
)
UPDATE sa_job j
   SET waiting = false, scheduled_for = greatest(j.scheduled_for, now())
  FROM dep
 WHERE j.id = ANY (ARRAY(SELECT dep.id FROM dep)) AND j.id = dep.id
   AND j.waiting IS NOT DISTINCT FROM true
RETURNING j.id, j.prompt_id, j.org_id, dep.predecessor, j.scheduled_for
"""

# served by sa_job_pkey (id) for the predecessors, sa_job_waiting_idx (after_job_id, id) WHERE
# waiting for each level of the chain. A job that ended without success (failed, cancelled,
# superseded) ends every job waiting on it, and every job waiting on those, down the whole chain,
# in one statement: each cancelled with error_kind dependency_failed and a message naming the job
# whose end it follows (`root`), so no job waits for ever.
# PERF: the walk is iterative (a recursive CTE is a loop, not a recursion: no stack depth to
# exceed), one index probe per job of the chain; bounded by SA_CHAIN_MAX_DEPTH in depth and by the
# org's queued jobs in width.
JOB_CANCEL_DEPENDENTS_MANY = """
WITH RECURSIVE root AS (
    SELECT p.id, p.state
      FROM (SELECT p.id, p.state FROM sa_job p WHERE p.id = ANY(%(job_ids)s::uuid[]) OFFSET 0) p
     WHERE p.state IN ('failed', 'cancelled', 'superseded')
), doomed AS (
    SELECT d.id, root.id AS root, root.state AS root_state
      FROM root
     CROSS JOIN LATERAL (SELECT w.id FROM sa_job w
                          WHERE w.after_job_id = root.id AND w.waiting OFFSET 0) AS d
    UNION ALL
    SELECT d.id, doomed.root, doomed.root_state
      FROM doomed
     CROSS JOIN LATERAL (SELECT w.id FROM sa_job w
                          WHERE w.after_job_id = doomed.id AND w.waiting OFFSET 0) AS d
)
UPDATE sa_job j
   SET state = 'cancelled', waiting = false, finished_at = now(),
       error_kind = 'dependency_failed',
       error_message = format('job %%s, which this job waits for, ended %%s', doomed.root,
                              doomed.root_state)
  FROM doomed
 WHERE j.id = ANY (ARRAY(SELECT doomed.id FROM doomed)) AND j.id = doomed.id
   AND j.waiting IS NOT DISTINCT FROM true
RETURNING j.id, j.prompt_id, j.org_id, j.attempt, doomed.root
"""

# served by sa_job_waiting_idx (after_job_id, id) WHERE waiting, then sa_job_pkey (id). Jobs
# waiting on a predecessor that no longer exists (deleted or archived by an operator's hand) are
# ended the same way: nothing would ever release them. Their own dependents follow through
# JOB_CANCEL_DEPENDENTS_MANY.
JOB_CANCEL_ORPHANED_MANY = """
UPDATE sa_job j
   SET state = 'cancelled', waiting = false, finished_at = now(),
       error_kind = 'dependency_failed',
       error_message = format('job %%s, which this job waits for, no longer exists', j.after_job_id)
 WHERE j.after_job_id = ANY(%(pred_ids)s::uuid[]) AND j.waiting
   AND NOT EXISTS (SELECT 1 FROM sa_job p WHERE p.id = j.after_job_id OFFSET 0)
RETURNING j.id, j.prompt_id, j.org_id, j.attempt, j.after_job_id AS root
"""

# served by sa_job_waiting_idx (after_job_id, id) WHERE waiting, keyset-paged on after_job_id,
# then sa_job_pkey (id) for each predecessor's state (NULL: it no longer exists). The leader's
# backstop (jobqueue/engine/chains.py, `sweep`): a predecessor that ended while jobs still wait on
# it, because its process died between the job's end and the settling of its dependents. Costs
# the waiting jobs, never the history.
JOB_LIST_WAITED_ON_PAGE = """
WITH preds AS (
    SELECT DISTINCT w.after_job_id
      FROM sa_job w
     WHERE w.waiting AND w.after_job_id > %(after)s::uuid
     ORDER BY w.after_job_id
     LIMIT %(limit)s
)
SELECT preds.after_job_id AS id,
       (SELECT p.state FROM sa_job p WHERE p.id = preds.after_job_id) AS state
  FROM preds
 ORDER BY preds.after_job_id
"""

# Re-arms a retried job's chain, in the retry's transaction: every job that its old job's failure
# ended (cancelled dependency_failed, not superseded yet), and theirs, down the chain, becomes
# superseded by a new job that waits on the new job of its predecessor, so the chain runs again
# once the retry succeeds. Each new job keeps its old one's prompt, priority, budget, options and
# chain depth.
# served by sa_job_after_idx (after_job_id) WHERE after_job_id IS NOT NULL (0014_workflows.sql)
# for each level, sa_job_supersedes_unique (supersedes) for the "not re-armed yet" test and
# sa_job_pkey (id) for the writes.
# NOTE: new ids are drawn in a MATERIALIZED step, once per job, so a child finds its parent's.
JOB_REARM_DEPENDENTS = """
WITH RECURSIVE ended AS (
    SELECT d.id, d.after_job_id AS pred
      FROM sa_job d
     WHERE d.after_job_id = %(old_job_id)s
       AND d.state IS NOT DISTINCT FROM 'cancelled'
       AND d.error_kind IS NOT DISTINCT FROM 'dependency_failed'
       AND NOT EXISTS (SELECT 1 FROM sa_job s WHERE s.supersedes = d.id OFFSET 0)
    UNION ALL
    SELECT d.id, d.after_job_id
      FROM ended
     CROSS JOIN LATERAL (SELECT w.id, w.after_job_id FROM sa_job w
                          WHERE w.after_job_id = ended.id
                            AND w.state IS NOT DISTINCT FROM 'cancelled'
                            AND w.error_kind IS NOT DISTINCT FROM 'dependency_failed'
                            AND NOT EXISTS (SELECT 1 FROM sa_job s
                                             WHERE s.supersedes = w.id OFFSET 0)
                         OFFSET 0) AS d
), fresh AS MATERIALIZED (
    SELECT ended.id, ended.pred, gen_random_uuid() AS new_id FROM ended
), superseded AS (
    UPDATE sa_job j
       SET state = 'superseded'
      FROM fresh
     WHERE j.id = ANY (ARRAY(SELECT fresh.id FROM fresh)) AND j.id = fresh.id
       AND j.state IS NOT DISTINCT FROM 'cancelled'
    RETURNING j.id, j.prompt_id, j.priority, j.max_attempts, j.execution_options, j.org_id,
              j.created_by, j.chain_depth
)
INSERT INTO sa_job (id, prompt_id, priority, max_attempts, execution_options, org_id, created_by,
                    supersedes, after_job_id, waiting, chain_depth)
SELECT fresh.new_id, s.prompt_id, s.priority, s.max_attempts, s.execution_options, s.org_id,
       s.created_by, s.id, coalesce(parent.new_id, %(new_job_id)s::uuid), true, s.chain_depth
  FROM superseded s
  JOIN fresh ON fresh.id = s.id
  LEFT JOIN fresh parent ON parent.id = fresh.pred
RETURNING id, prompt_id, org_id, supersedes
"""
