-- Job-event notifications on two channels, with payloads Postgres can fold.
-- PERF: one payload per transition meant that a batch of N transitions committed together sent N
-- notifications, and every worker parsed the SSE hubs' traffic as well as its own. Postgres folds
-- identical (channel, payload) pairs within a transaction, so:
--   sa_job_event   every transition; empty payload. A wake-up call for the SSE hubs, which read
--                  the event rows themselves.
--   sa_job_queued  a job became queued (enqueue, retry, requeue, release); empty payload when it
--                  is claimable now, else its scheduled_for in epoch seconds, so an idle worker
--                  knows when to look. Only workers listen here.
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
    PERFORM pg_notify('sa_job_event', '');
    IF NEW.state = 'queued' THEN
        PERFORM pg_notify('sa_job_queued', CASE WHEN NEW.scheduled_for <= now() THEN ''
                                                ELSE extract(epoch FROM NEW.scheduled_for)::text END);
    END IF;
    RETURN NULL;
END;
$$;
