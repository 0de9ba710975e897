-- Cancel one queued or running job, by hand, through the same state machine as the code.
--
--   psql "$DATABASE_URL" -v job_id=<uuid> [-v reason='why'] -f jobqueue/sql/ops/cancel_job.sql
--
-- Same effect as `sa-core cancel-job ID`: queued|running -> cancelled, finished_at and
-- error_message set, one sa_job_event row written by the trigger and NOTIFYed below. A running job's
-- worker loses its claim: it reads that event within SA_CANCEL_CHECK_INTERVAL (0.5 s), closes the
-- provider call and writes nothing (no response, ledger or audit row). Jobs waiting on it (`after`) are cancelled
-- by the maintenance leader's next round (jobqueue/engine/chains.py, `sweep`); `sa-core
-- cancel-job` cancels them at once.
--
-- Nothing here checks the state: the transition trigger sa_job_guard (0001_core_schema.sql)
-- does, exactly as it does for the code, so a finished job is refused with its message
-- ("... is succeeded (terminal) and cannot change to cancelled") and nothing changes.
-- Exit status: 0 cancelled; 3 refused, unknown id or bad arguments (psql's status for a failed
-- script; the message says which).

\set ON_ERROR_STOP on
\set QUIET on

\if :{?job_id}
\else
    \echo 'usage: psql "$DATABASE_URL" -v job_id=<uuid> [-v reason=...] -f jobqueue/sql/ops/cancel_job.sql'
    -- NOTE: psql has no "exit with status" command; a failing statement ends the script with 3.
    DO $$ BEGIN RAISE EXCEPTION 'missing variable: -v job_id=<uuid>'; END $$;
\endif
\if :{?reason}
\else
    \set reason 'cancelled by an operator (psql)'
\endif

BEGIN;

-- served by sa_job_pkey (id); the row lock makes a concurrent claim or finalize go first or after.
UPDATE sa_job
   SET state = 'cancelled', waiting = false, finished_at = now(), error_message = :'reason'
 WHERE id = :'job_id'
RETURNING id AS job_id, prompt_id, org_id, state, attempt, max_attempts,
          worker_claim AS claim_dropped;

SELECT :ROW_COUNT = 1 AS cancelled, :'job_id' AS job_id \gset
\if :cancelled
    -- Wake the SSE streams (the trigger no longer notifies: 0006_notify_out_of_band.sql).
    NOTIFY sa_job_event;
    COMMIT;
    \echo 'job' :job_id 'cancelled'
\else
    ROLLBACK;
    SELECT set_config('sa_ops.job_id', :'job_id', false) AS job_id \gset
    DO $$ BEGIN RAISE EXCEPTION 'job % not found', current_setting('sa_ops.job_id'); END $$;
\endif
