-- One sa_job_event row per transition (creation included): the job history (job-details), the
-- SSE replay log (Last-Event-ID) and the source of transition figures. It records; it notifies
-- nobody (the committing process sends coalesced wake-ups: jobqueue/core/wakeup.py) and decides
-- nothing.
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

CREATE OR REPLACE TRIGGER sa_job_event_log AFTER INSERT OR UPDATE OF state ON public.sa_job FOR EACH ROW EXECUTE FUNCTION sa_job_record_event();
