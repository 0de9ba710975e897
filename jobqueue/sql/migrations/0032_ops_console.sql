-- The operator console (/mission/ops): read-only operator tokens, and the log of what operators did.
--
-- `ops:read` sees every org's queue, jobs, routes and workers but changes nothing; `ops` acts too.
ALTER TABLE sa_api_token
    DROP CONSTRAINT sa_api_token_scopes_known,
    ADD CONSTRAINT sa_api_token_scopes_known CHECK (scopes <@ ARRAY['ops', 'ops:read']::text[]);

-- One row per operator action: who (the ops token's org and user), what, on which jobs (how many,
-- their ids, and the filter or selection asked for), when. A bulk action writes its row first
-- and adds each batch to it in that batch's own transaction, so the row counts exactly the jobs
-- whose change committed, even when the action stops half way. `job_ids` holds at most the bulk
-- bound (service/ops_contract.py, OPS_BULK_MAX). Only ever appended to while the action runs;
-- kept as long as the database is (a few rows a day).
CREATE TABLE sa_ops_action (
    id          bigserial PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    org_id      bigint NOT NULL,
    user_id     bigint NOT NULL,
    action      text NOT NULL,
    target      jsonb NOT NULL DEFAULT '{}'::jsonb,
    job_count   integer NOT NULL DEFAULT 0,
    job_ids     uuid[] NOT NULL DEFAULT '{}',
    batches     integer NOT NULL DEFAULT 0,
    CONSTRAINT sa_ops_action_known CHECK (action IN (
        'cancel', 'retry', 'bulk_cancel', 'bulk_retry', 'pause_route', 'resume_route')),
    CONSTRAINT sa_ops_action_target_object CHECK (jsonb_typeof(target) = 'object')
);
-- NOTE: the console pages the log newest first by id (sa_ops_action_pkey): no other index.

-- Each attempt's own error message, kept with its provider call (the ledger row the finalize
-- writes), so a job's history shows every attempt's error, not only the latest one the job row
-- keeps. NULL for a call that succeeded. The archive keeps it too.
ALTER TABLE sa_ledger ADD COLUMN error_message text;
ALTER TABLE sa_ledger_archive ADD COLUMN error_message text;
