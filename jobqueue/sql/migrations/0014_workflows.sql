-- Workflows (issue 15): batch submits under one Idempotency-Key.

-- A batch's key row also holds every item's ids in input order, so a repeat of the batch answers
-- all of them; prompt_id and job_id stay those of the first item (their constraints unchanged).
-- NULL for a single-prompt key.
ALTER TABLE sa_idempotency_key
    ADD COLUMN batch_prompt_ids uuid[],
    ADD COLUMN batch_job_ids uuid[];

-- Chains: a job submitted with `after` waits for its predecessor (another job of its org).
-- NOTE: no new state. A waiting dependent is `queued` with scheduled_for at WAITING_UNTIL
-- (9999-12-31, jobqueue/engine/enqueue.py): the claim already skips jobs not yet due, cancel
-- already takes queued jobs, and every reader of the state machine stays as it is. The claim
-- index (priority, scheduled_for) keeps waiting jobs at the end of each priority's range.
ALTER TABLE sa_job ADD COLUMN after_job_id uuid;
-- NOTE: serves the triggers below: a finished job's waiting dependents, and nothing else.
CREATE INDEX sa_job_after_idx ON sa_job (after_job_id) WHERE after_job_id IS NOT NULL;

ALTER TABLE sa_job DROP CONSTRAINT sa_job_error_kind_valid;
ALTER TABLE sa_job ADD CONSTRAINT sa_job_error_kind_valid CHECK (error_kind IN (
    'timeout', 'rate_limit', 'provider_5xx', 'provider_4xx', 'parse', 'auth',
    'worker_crash', 'stuck', 'unknown', 'invalid_options', 'dependency_failed'));

-- A job's end decides its waiting dependents, in the same transaction, whichever path ended it
-- (finalize, cancel, reject, reclaim, operator SQL):
-- - succeeded: each is released (due now) and, unless its prompt names a parent of its own,
--   continues the predecessor's thread: the response becomes its prompt's parent;
-- - failed, cancelled or superseded: each ends cancelled with error_kind 'dependency_failed'
--   (so no job waits for ever); their own dependents follow, as this trigger fires for them.
CREATE FUNCTION sa_job_settle_dependents() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'succeeded' THEN
        UPDATE sa_entity p
           SET parent_id = r.id, causation_id = r.id, correlation_id = r.correlation_id
          FROM sa_job d, sa_entity r
         WHERE d.after_job_id = NEW.id AND d.state = 'queued'
           AND d.scheduled_for = '9999-12-31 00:00:00+00'
           AND p.id = d.prompt_id AND p.parent_id IS NULL AND r.id = NEW.response_id;
        UPDATE sa_job
           SET scheduled_for = now()
         WHERE after_job_id = NEW.id AND state = 'queued'
           AND scheduled_for = '9999-12-31 00:00:00+00';
    ELSE
        UPDATE sa_job
           SET state = 'cancelled', finished_at = now(), error_kind = 'dependency_failed',
               error_message = format('its predecessor, job %s, ended %s', NEW.id, NEW.state)
         WHERE after_job_id = NEW.id AND state = 'queued'
           AND scheduled_for = '9999-12-31 00:00:00+00';
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER sa_job_settle_dependents AFTER UPDATE OF state ON sa_job
    FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state
          AND NEW.state IN ('succeeded', 'failed', 'cancelled', 'superseded'))
    EXECUTE FUNCTION sa_job_settle_dependents();

-- A retry of a predecessor re-arms the dependents its failure ended: each gets a new job (its
-- retry, superseding the ended one) waiting on the new predecessor job, so the dependent runs
-- once the retry succeeds. Their own ended dependents follow, as this trigger fires for them.
CREATE FUNCTION sa_job_rearm_dependents() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH ended AS (
        SELECT d.id, d.prompt_id, d.priority, d.max_attempts, d.execution_options, d.org_id,
               d.created_by
          FROM sa_job d
         WHERE d.after_job_id = NEW.supersedes AND d.state = 'cancelled'
           AND d.error_kind = 'dependency_failed'
           AND NOT EXISTS (SELECT 1 FROM sa_job s WHERE s.supersedes = d.id)
    ), superseded AS (
        UPDATE sa_job d SET state = 'superseded' FROM ended WHERE d.id = ended.id
    )
    INSERT INTO sa_job (id, prompt_id, priority, max_attempts, execution_options, org_id,
                        created_by, supersedes, scheduled_for, after_job_id)
    SELECT gen_random_uuid(), prompt_id, priority, max_attempts, execution_options, org_id,
           created_by, id, '9999-12-31 00:00:00+00', NEW.id
      FROM ended;
    RETURN NULL;
END;
$$;
CREATE TRIGGER sa_job_rearm_dependents AFTER INSERT ON sa_job
    FOR EACH ROW
    WHEN (NEW.supersedes IS NOT NULL)
    EXECUTE FUNCTION sa_job_rearm_dependents();

-- Fair sharing: the claim (JOB_CLAIM_MANY) reads each org's claimable jobs in claim order, so
-- orgs take turns within a priority (and among jobs aged past SA_PRIORITY_AGING) at a cost
-- bounded by the orgs waiting, not the backlog.
CREATE INDEX sa_job_org_claim_idx ON sa_job (org_id, priority, scheduled_for)
    WHERE state = 'queued';
