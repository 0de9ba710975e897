"""The scrape-time read behind the web's /metrics: queue depth by active state, oldest claimable job."""

__all__ = ["JOB_QUEUE_DEPTH"]

# served by partial indexes only: sa_job_org_queued_idx (org_id) WHERE state = 'queued' (0004)
# for the queued count, sa_job_claim_idx (priority, scheduled_for) WHERE state = 'queued' AND NOT
# waiting (0016) for the oldest claimable job, and sa_job_worker_claim_idx or sa_job_heartbeat_idx
# (WHERE state = 'running', 0001) for the running count. Finished jobs are in none of them, so a
# scrape costs in proportion to the backlog, never to the history.
# PERF: run under JOB_PLAN_SETTINGS (queries/job.py): when the backlog outgrows the history the
# planner would otherwise read the whole table to count it.
# NOTE: three scalar subqueries, not one GROUP BY state: each equality on `state` matches one
# partial index's predicate, where `state IN (...)` would push the planner towards the table.
# The oldest job counts from its due time (scheduled_for), so a job deliberately scheduled for
# later, waiting out a retry backoff or waiting for its predecessor, is not "waiting for a
# worker" yet.
JOB_QUEUE_DEPTH = """
SELECT (SELECT count(*) FROM sa_job WHERE state = 'queued') AS queued,
       (SELECT count(*) FROM sa_job WHERE state = 'running') AS running,
       (SELECT coalesce(extract(epoch FROM now() - min(scheduled_for)), 0)::float8
          FROM sa_job
         WHERE state = 'queued' AND NOT waiting AND scheduled_for <= now())
           AS oldest_queued_seconds
"""
