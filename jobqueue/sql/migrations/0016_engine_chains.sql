-- Chains settled by the engine, not by triggers (issues 22 and 23).
--
-- 0014's triggers decided transitions inside the database and recursed once per link of a chain:
-- ending the first job of a chain of about 800 failed with `stack depth limit exceeded`, and the
-- finalize or reclaim page holding it failed with it, for every org. The engine now settles a
-- finished job's dependents itself, in set-based statements after the job's own transition
-- (jobqueue/engine/chains.py), and the maintenance leader settles any it finds stranded.
DROP TRIGGER sa_job_settle_dependents ON sa_job;
DROP FUNCTION sa_job_settle_dependents();
DROP TRIGGER sa_job_rearm_dependents ON sa_job;
DROP FUNCTION sa_job_rearm_dependents();

-- "Waiting for its predecessor" has a name of its own instead of a scheduled_for in year 9999: a
-- waiting job is queued (it still counts against SA_ORG_MAX_QUEUED) but no claim reads it, and its
-- scheduled_for keeps the time it was asked to run at (run_at, delay_seconds), honoured once
-- released. chain_depth is the number of predecessors before it, bounded at submit by
-- SA_CHAIN_MAX_DEPTH.
ALTER TABLE sa_job
    ADD COLUMN waiting boolean NOT NULL DEFAULT false,
    ADD COLUMN chain_depth integer NOT NULL DEFAULT 0;

UPDATE sa_job SET waiting = true, scheduled_for = created_at
 WHERE state = 'queued' AND scheduled_for = '9999-12-31 00:00:00+00';

-- NOTE: from each chain's first dependent (sa_job_after_idx), not from every job.
WITH RECURSIVE chain AS (
    SELECT d.id, 1 AS depth
      FROM sa_job d JOIN sa_job p ON p.id = d.after_job_id
     WHERE d.after_job_id IS NOT NULL AND p.after_job_id IS NULL
    UNION ALL
    SELECT j.id, chain.depth + 1 FROM sa_job j JOIN chain ON j.after_job_id = chain.id
)
UPDATE sa_job SET chain_depth = chain.depth FROM chain WHERE sa_job.id = chain.id;

ALTER TABLE sa_job
    ADD CONSTRAINT sa_job_waiting_is_queued
        CHECK (NOT waiting OR (state = 'queued' AND after_job_id IS NOT NULL)),
    ADD CONSTRAINT sa_job_chain_depth_range CHECK (chain_depth >= 0);

-- The claim indexes hold claimable jobs only: waiting ones are not read by any claim.
DROP INDEX sa_job_claim_idx;
CREATE INDEX sa_job_claim_idx ON sa_job (priority, scheduled_for)
    WHERE state = 'queued' AND NOT waiting;
DROP INDEX sa_job_org_claim_idx;
CREATE INDEX sa_job_org_claim_idx ON sa_job (org_id, priority, scheduled_for)
    WHERE state = 'queued' AND NOT waiting;
-- Serves the leader's sweep for waiting jobs whose predecessor already ended
-- (JOB_LIST_STRANDED_PAGE): every waiting job, and nothing else.
CREATE INDEX sa_job_waiting_idx ON sa_job (after_job_id, id) WHERE waiting;

-- A job whose every write keeps failing in the database (a row no statement can write, say a
-- broken constraint or an operator's trigger) is set aside here with the error, so the batch
-- statements that would hold it (finalize, heartbeat, reclaim) go on without it. Not a state:
-- the job row is left as it is, since no write to it succeeds. An operator deletes the row once
-- the cause is mended, and the reclaimer takes the job again (ops/README.md).
CREATE TABLE sa_job_quarantine (
    job_id     uuid PRIMARY KEY,
    org_id     bigint NOT NULL,
    operation  text NOT NULL,
    error      text NOT NULL,
    at         timestamptz NOT NULL DEFAULT now()
);
