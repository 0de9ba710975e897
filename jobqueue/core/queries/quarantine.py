"""Statements on sa_job_quarantine: jobs set aside because no write to them succeeds."""

__all__ = ["JOB_QUARANTINE_COUNT", "JOB_QUARANTINE_INSERT"]

# served by sa_job_quarantine_pkey (job_id). The latest failure wins: an operator sees what the
# job's last write met.
JOB_QUARANTINE_INSERT = """
INSERT INTO sa_job_quarantine (job_id, org_id, operation, error)
VALUES (%(job_id)s, %(org_id)s, %(operation)s, %(error)s)
ON CONFLICT (job_id) DO UPDATE
   SET operation = excluded.operation, error = excluded.error, at = excluded.at
"""

# NOTE: a handful of rows at most; read by queue-metrics.
JOB_QUARANTINE_COUNT = "SELECT count(*) AS quarantined FROM sa_job_quarantine"
