-- Transitions no longer NOTIFY: the processes that commit them send coalesced wake-ups.
--
-- The event trigger keeps the job history (sa_job_event) and no longer calls pg_notify.
-- PERF: Postgres serialises notifying commits on one lock held through the commit's WAL flush,
-- and every transition (enqueue, claim, finalize: three per job) notified, so under steady
-- arrivals commits queued on `Lock:object`. The processes that commit transitions now send the
-- wake-ups themselves, after their commit, coalesced over a short window (jobqueue/core/wakeup.py), on
-- the same channels with the same payloads, so listeners do not change:
--   sa_job_event   something changed (empty payload): the SSE hubs read the event rows.
--   sa_job_queued  a job became queued: empty when claimable now, else its scheduled_for in
--                  epoch seconds. Only workers listen here.
-- Operator SQL that changes jobs by hand NOTIFYs explicitly (sql/ops/cancel_job.sql,
-- sql/ops/retry_job.sql); the poll (SA_POLL_INTERVAL) covers any wake-up that is lost.
CREATE OR REPLACE FUNCTION sa_job_record_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    from_state text;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF OLD.state = NEW.state THEN
            RETURN NULL;
        END IF;
        from_state := OLD.state;
    END IF;
    INSERT INTO sa_job_event (job_id, prompt_id, org_id, created_by, from_state, to_state,
                              attempt, worker_claim, error_kind, response_id)
    VALUES (NEW.id, NEW.prompt_id, NEW.org_id, NEW.created_by, from_state, NEW.state,
            NEW.attempt, NEW.worker_claim, NEW.error_kind, NEW.response_id);
    RETURN NULL;
END;
$$;
