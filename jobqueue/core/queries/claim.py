"""Statements of the claim: which queued jobs a worker takes, and when the next one falls due.

Run under JOB_PLAN_SETTINGS (queries/job.py) in the claim's transaction.
"""

__all__ = [
    "JOB_CLAIM_CANDIDATES",
    "JOB_CLAIM_CANDIDATES_BY_TOKENS",
    "JOB_CLAIM_CANDIDATES_ORG_CAPPED",
    "JOB_CLAIM_IDS",
    "JOB_CLAIM_LOCK_ORG_CAPPED",
    "JOB_CLAIM_MANY",
    "JOB_CLAIM_MANY_BY_TOKENS",
    "JOB_CLAIM_MANY_ORG_CAPPED",
    "JOB_NEXT_DUE",
]

# NOTE: shared by both claim statements: what a claim writes and hands back. Each job comes
# with its context (the prompt and up to `depth` ancestors, oldest first, by sa_entity_pkey
# probes) so running it needs no further read: PERF, one round trip fewer per job.
# NOTE: the depth is read with no cast that can fail (one undecodable row would fail the whole
# claim, for every worker): a depth that is not 0..99 reads no ancestor, and claim.py then fails
# that job as invalid_options.
# PERF: the entities are looked up by id alone and their org checked on the rows found (a row
# of another org is neither returned nor followed). With `org_id = ...` beside `id = ...` in the
# lookup, statistics taken on a small table let the planner walk sa_entity_org_updated_idx,
# every entity of the org for each job claimed: 200 ms a claim after a few thousand jobs.
_CLAIM_SET = """
, claimed AS (
    UPDATE sa_job j
       SET state = 'running',
           worker_claim = %(claim)s,
           claimed_at = now(),
           started_at = now(),
           running_heartbeat_at = now()
      FROM picked
     WHERE j.id = picked.id
    RETURNING j.id, j.prompt_id, j.org_id, j.created_by, j.priority, j.attempt, j.max_attempts,
              j.execution_options, j.supersedes, j.created_at, j.scheduled_for, j.claimed_at,
              j.throttled_at, j.route
)
SELECT $counted claimed.*, (
    WITH RECURSIVE chain AS (
        SELECT id, org_id, kind, parent_id, content, 0 AS depth
          FROM sa_entity
         WHERE id = claimed.prompt_id
        UNION ALL
        SELECT e.id, e.org_id, e.kind, e.parent_id, e.content, chain.depth + 1
          FROM sa_entity e
          JOIN chain ON e.id = chain.parent_id
         WHERE chain.org_id = claimed.org_id
           AND chain.depth < CASE
               WHEN NOT claimed.execution_options ? 'depth' THEN %(default_depth)s
               WHEN jsonb_typeof(claimed.execution_options -> 'depth') = 'number'
                    AND claimed.execution_options ->> 'depth' ~ '^[0-9]{1,2}$'
               THEN (claimed.execution_options ->> 'depth')::int
               ELSE 0
           END
    )
    SELECT jsonb_agg(jsonb_build_object('kind', kind, 'content', content) ORDER BY depth DESC)
      FROM chain
     WHERE org_id = claimed.org_id
) AS context
  FROM $source
 ORDER BY claimed.priority, claimed.scheduled_for
"""

_CLAIMED = _CLAIM_SET.replace("$counted ", "").replace("$source", "claimed")

# NOTE: _CLAIMED with how many heads the claim chose (`chosen`, on every row), and one row of
# NULL columns but `chosen` when it took none. SKIP LOCKED passes over a head that another
# claim holds without taking the next one instead, so a claim that took fewer jobs than it chose
# met a contended queue, not an empty one: the worker claims again when a slot frees
# (jobqueue/runtime/worker.py), and only then.
_CLAIMED_COUNTED = _CLAIM_SET.replace("$counted", "counted.chosen,").replace(
    "$source", "(SELECT count(*) AS chosen FROM chosen) AS counted LEFT JOIN claimed ON true")

# Fair sharing: within a priority, orgs take turns. `orgs` lists the orgs with queued work by a
# loose index scan of sa_job_org_queued_idx (org_id) WHERE state = 'queued' (0004), one probe
# per org; `heads` reads each org's first `limit` claimable jobs in (priority, scheduled_for)
# order from sa_job_org_claim_idx (org_id, priority, scheduled_for) WHERE state = 'queued' AND
# NOT waiting (0016: a job waiting for its predecessor is never claimable), numbering them per
# priority (`turn`, from the index order: no sort of the backlog);
# `picked` takes, most urgent priority first, every org's first turn, then every org's second,
# ..., oldest first within a turn, up to the caller's free slots, and locks them by sa_job_pkey.
# SKIP LOCKED keeps concurrent claimers disjoint (a head another claimer holds is skipped, not
# replaced: that claim takes fewer, and the next round more).
# Priority aging: among those heads, one due for `aging` seconds or more ranks before every
# priority (`rank` -1), still taking turns with the other orgs' aged heads, so another org's
# low-priority work waits about that long at most behind a flood of urgent work. An org's own
# low-priority jobs stay behind its own more urgent ones (they are not among its heads).
# PERF: reads at most (orgs with queued work) x `limit` index entries and sorts only those, so
# its cost grows with the number of orgs waiting, never with the backlog (tests/test_plans.py,
# bench/fairness.py). Run under JOB_PLAN_SETTINGS. Two details keep it so, each once a read of
# the whole queue per claim: the window's frame is ROWS (the default RANGE frame reads every
# peer of a row first, and the jobs of one group submit or batch share their scheduled_for),
# and the loose scan's last row, a NULL org, joins no heads (walking an index led by org_id
# for it finds nothing, but a plan that walks sa_job_claim_idx and filters on org_id reads the
# whole queue to find nothing).
# NOTE: `held_orgs` (the orgs past their budget, SA_ORG_BUDGET_DAILY/_MONTHLY) are passed over
# whole: their queued jobs wait, unclaimed, until the budget frees (jobqueue/engine/spend.py).
# NOTE: the claim's choice, shared with JOB_CLAIM_CANDIDATES: a job set aside in
# sa_job_quarantine (one probe of its primary key per head read) is never chosen.
_CLAIM_HEADS = """
WITH RECURSIVE orgs AS (
    (SELECT org_id FROM sa_job WHERE state = 'queued' ORDER BY org_id LIMIT 1)
    UNION ALL
    SELECT (SELECT j.org_id FROM sa_job j
             WHERE j.state = 'queued' AND j.org_id > orgs.org_id
             ORDER BY j.org_id LIMIT 1)
      FROM orgs
     WHERE orgs.org_id IS NOT NULL
), heads AS (
    SELECT head.id, head.org_id, head.scheduled_for, head.turn,
           CASE WHEN head.scheduled_for <= now() - make_interval(secs => %(aging)s) THEN -1
                ELSE head.priority END AS rank
      FROM orgs
     CROSS JOIN LATERAL (
           SELECT j.id, j.org_id, j.priority, j.scheduled_for,
                  row_number() OVER (PARTITION BY j.priority ORDER BY j.scheduled_for
                                     ROWS UNBOUNDED PRECEDING) AS turn
             FROM sa_job j
            WHERE j.state = 'queued'
              AND NOT j.waiting
              AND j.org_id = orgs.org_id
              AND orgs.org_id <> ALL (%(held_orgs)s::bigint[])
              AND j.priority <= %(ceiling)s
              AND j.scheduled_for <= now()
              AND NOT EXISTS (SELECT 1 FROM sa_job_quarantine qq WHERE qq.job_id = j.id)
            ORDER BY j.priority, j.scheduled_for
            LIMIT %(limit)s) AS head
     WHERE orgs.org_id IS NOT NULL
"""

_CLAIM_CHOICE = (
    _CLAIM_HEADS
    + """), chosen AS (
    SELECT heads.id, heads.org_id
      FROM heads
     ORDER BY heads.rank, heads.turn, heads.scheduled_for
     LIMIT %(limit)s
)
"""
)

# Fair by tokens (SA_FAIR_BY_TOKENS): the same heads, taken in the order of the tokens each org
# would have used by its turn, not of the turn alone. `usage` sums each waiting org's tokens
# (calls in flight at their estimate) and calls over the current and the previous window of
# `token_window` seconds, by sa_org_token_window_pkey (org_id, window_start): one probe per org
# with queued work. An org's n-th head ranks at its recent tokens + n x its tokens per call (an
# org with no recent call: the waiting orgs' average, else 1, so it ranks by turn): an org of
# long prompts gets fewer turns, one of short prompts more, until their recent tokens are even.
# Priority (`rank`, aging included) still comes first. Reads what _CLAIM_CHOICE reads, and
# that table.
_CLAIM_CHOICE_BY_TOKENS = (
    _CLAIM_HEADS
    + """), usage AS (
    SELECT w.org_id, sum(w.tokens)::float8 AS tokens, sum(w.calls)::float8 AS calls
      FROM orgs
      JOIN sa_org_token_window w
        ON w.org_id = orgs.org_id
       AND w.window_start >= now() - make_interval(secs => 2 * %(token_window)s)
     GROUP BY w.org_id
), overall AS (
    SELECT sum(usage.tokens) / nullif(sum(usage.calls), 0) AS per_call FROM usage
), chosen AS (
    SELECT heads.id, heads.org_id
      FROM heads
      LEFT JOIN usage ON usage.org_id = heads.org_id
     CROSS JOIN overall
     ORDER BY heads.rank,
              coalesce(usage.tokens, 0) + heads.turn * coalesce(
                  usage.tokens / nullif(usage.calls, 0), overall.per_call, 1),
              heads.scheduled_for
     LIMIT %(limit)s
)
"""
)

_PICK_CHOSEN = """, picked AS (
    SELECT j.id
      FROM sa_job j
     WHERE j.id = ANY (ARRAY(SELECT chosen.id FROM chosen))
       AND j.state IS NOT DISTINCT FROM 'queued'
       FOR UPDATE SKIP LOCKED
)
"""

JOB_CLAIM_MANY = _CLAIM_CHOICE + _PICK_CHOSEN + _CLAIMED_COUNTED

# JOB_CLAIM_MANY, fair by tokens (SA_FAIR_BY_TOKENS; see _CLAIM_CHOICE_BY_TOKENS).
JOB_CLAIM_MANY_BY_TOKENS = _CLAIM_CHOICE_BY_TOKENS + _PICK_CHOSEN + _CLAIMED_COUNTED

# The jobs JOB_CLAIM_MANY would take, without taking them: when the claim statement fails on a
# row (jobqueue/engine/claim.py), these are claimed by id around the one that cannot be written.
JOB_CLAIM_CANDIDATES = _CLAIM_CHOICE + "SELECT id, org_id FROM chosen"

# JOB_CLAIM_CANDIDATES, fair by tokens.
JOB_CLAIM_CANDIDATES_BY_TOKENS = _CLAIM_CHOICE_BY_TOKENS + "SELECT id, org_id FROM chosen"

# served by sa_job_pkey (id): the claim of the given jobs (JOB_CLAIM_CANDIDATES' or
# JOB_CLAIM_CANDIDATES_ORG_CAPPED's), one part of them at a time, guarded as the claims are.
JOB_CLAIM_IDS = (
    """
WITH picked AS (
    SELECT j.id
      FROM sa_job j
     WHERE j.id = ANY (%(job_ids)s::uuid[])
       AND j.state IS NOT DISTINCT FROM 'queued'
       AND j.waiting IS NOT DISTINCT FROM false
       FOR UPDATE SKIP LOCKED
)
"""
    + _CLAIMED
)


# served by sa_job_claim_idx (priority, scheduled_for) WHERE state = 'queued' AND NOT waiting
# (0016): a loose scan, one descent per priority with claimable jobs (101 at most) and one
# probe each for its first job due later; never the backlog. Seconds until the soonest, NULL when
# nothing is scheduled. Run under JOB_PLAN_SETTINGS.
JOB_NEXT_DUE = """
WITH RECURSIVE priorities AS (
    (SELECT priority FROM sa_job
      WHERE state = 'queued' AND NOT waiting AND priority <= %(ceiling)s
      ORDER BY priority LIMIT 1)
    UNION ALL
    SELECT (SELECT j.priority FROM sa_job j
             WHERE j.state = 'queued' AND NOT j.waiting AND j.priority > priorities.priority
               AND j.priority <= %(ceiling)s
             ORDER BY j.priority LIMIT 1)
      FROM priorities
     WHERE priorities.priority IS NOT NULL
)
SELECT extract(epoch FROM min(
           (SELECT j.scheduled_for FROM sa_job j
             WHERE j.state = 'queued' AND NOT j.waiting AND j.priority = priorities.priority
               AND j.scheduled_for > now()
             ORDER BY j.scheduled_for LIMIT 1)) - now())::float8 AS seconds
  FROM priorities
 WHERE priorities.priority IS NOT NULL
"""

# NOTE: taken (in the claim's transaction, before the claim statement takes its snapshot) only
# when a per-org running cap is set, so capped claims see each other's results and the cap holds
# exactly. Uncapped claims never take it.
JOB_CLAIM_LOCK_ORG_CAPPED = "SELECT pg_advisory_xact_lock(hashtext('sa-core claim org-capped'))"

# served by sa_job_claim_idx for the queued rows and sa_job_worker_claim_idx (worker_claim)
# WHERE state = 'running' for the running counts. Ranks each org's claimable jobs so one
# claim never takes more than an org's remaining room (`org_cap` minus its running jobs).
# PERF: reads every claimable row to rank it, so its cost grows with the backlog whatever the plan
# (the per-org rank needs them all); only used when SA_ORG_MAX_RUNNING is set. It runs under
# JOB_PLAN_SETTINGS too, so it reads them through sa_job_claim_idx, never the table.
_CAPPED_CHOICE = """
WITH running AS (
    SELECT org_id, count(*) AS n FROM sa_job WHERE state = 'running' GROUP BY org_id
), ranked AS (
    SELECT q.id, q.org_id, q.priority, q.scheduled_for, coalesce(r.n, 0) AS running,
           row_number() OVER (PARTITION BY q.org_id ORDER BY q.priority, q.scheduled_for) AS rank
      FROM sa_job q LEFT JOIN running r USING (org_id)
     WHERE q.state = 'queued'
       AND NOT q.waiting
       AND q.org_id <> ALL (%(held_orgs)s::bigint[])
       AND q.priority <= %(ceiling)s
       AND q.scheduled_for <= now()
       AND NOT EXISTS (SELECT 1 FROM sa_job_quarantine qq WHERE qq.job_id = q.id)
)
"""

JOB_CLAIM_MANY_ORG_CAPPED = (
    _CAPPED_CHOICE
    + """, picked AS (
    SELECT id FROM sa_job
     WHERE id IN (SELECT id FROM ranked WHERE running + rank <= %(org_cap)s)
       AND state = 'queued'
     ORDER BY priority, scheduled_for
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
"""
    + _CLAIMED
)

# JOB_CLAIM_CANDIDATES for the org-capped claim (run under its lock, JOB_CLAIM_LOCK_ORG_CAPPED).
JOB_CLAIM_CANDIDATES_ORG_CAPPED = (
    _CAPPED_CHOICE
    + """
SELECT id, org_id FROM ranked
 WHERE running + rank <= %(org_cap)s
 ORDER BY priority, scheduled_for
 LIMIT %(limit)s
"""
)
