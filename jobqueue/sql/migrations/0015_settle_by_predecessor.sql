-- Steady load (issue 18): a finished job's dependents are found by sa_job_after_idx alone.
-- PERF: 0014's trigger guarded its statements with `state = 'queued'`, which let the planner
-- serve them from a partial index of the queue (sa_job_org_claim_idx, walked whole for its
-- scheduled_for) instead: every finished job read the whole backlog twice, and under steady
-- arrivals the worker fell behind for good. The guards are now written `IS NOT DISTINCT FROM`
-- (the same test; state and scheduled_for are never NULL), which no index predicate proves, so
-- the probe of sa_job_after_idx (after_job_id = NEW.id) is the only path
-- (jobqueue/core/queries/job.py explains the form; tests/test_plans.py checks these statements).
-- Most jobs have no dependent: one probe of that index, and the trigger is done. A dependent's
-- prompt is updated only while it has no parent of its own, tested as num_nulls(parent_id) = 1:
-- `parent_id IS NULL` would let the planner walk sa_entity_org_parent_idx's NULL entries (every
-- thread's first prompt, of every org) instead of probing the dependents' prompts by id.
CREATE OR REPLACE FUNCTION sa_job_settle_dependents() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM sa_job WHERE after_job_id = NEW.id) THEN
        RETURN NULL;
    END IF;
    IF NEW.state = 'succeeded' THEN
        UPDATE sa_entity p
           SET parent_id = r.id, causation_id = r.id, correlation_id = r.correlation_id
          FROM sa_job d, sa_entity r
         WHERE d.after_job_id = NEW.id AND d.state IS NOT DISTINCT FROM 'queued'
           AND d.scheduled_for IS NOT DISTINCT FROM '9999-12-31 00:00:00+00'
           AND p.id = d.prompt_id AND num_nulls(p.parent_id) = 1 AND r.id = NEW.response_id;
        UPDATE sa_job
           SET scheduled_for = now()
         WHERE after_job_id = NEW.id AND state IS NOT DISTINCT FROM 'queued'
           AND scheduled_for IS NOT DISTINCT FROM '9999-12-31 00:00:00+00';
    ELSE
        UPDATE sa_job
           SET state = 'cancelled', finished_at = now(), error_kind = 'dependency_failed',
               error_message = format('its predecessor, job %s, ended %s', NEW.id, NEW.state)
         WHERE after_job_id = NEW.id AND state IS NOT DISTINCT FROM 'queued'
           AND scheduled_for IS NOT DISTINCT FROM '9999-12-31 00:00:00+00';
    END IF;
    RETURN NULL;
END;
$$;
