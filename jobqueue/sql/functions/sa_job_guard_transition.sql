-- The state machine of spec section 3, enforced for code and operator SQL alike: it refuses any
-- other transition, and decides none (every transition is made by jobqueue/engine/).
-- jobqueue/core/states.py mirrors the table (tests/test_http_api.py tries every pair here).
CREATE OR REPLACE FUNCTION sa_job_guard_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state <> 'queued' THEN
            RAISE EXCEPTION 'sa_job % must be created queued, not %', NEW.id, NEW.state
                USING ERRCODE = 'check_violation', CONSTRAINT = 'sa_job_transition_legal';
        END IF;
        RETURN NEW;
    END IF;
    IF OLD.state IN ('succeeded', 'failed', 'cancelled', 'superseded') THEN
        IF NEW.state = 'superseded' AND OLD.state <> 'superseded' THEN
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'sa_job % is % (terminal) and cannot change to %', OLD.id, OLD.state, NEW.state
            USING ERRCODE = 'check_violation', CONSTRAINT = 'sa_job_transition_legal';
    END IF;
    IF OLD.state = NEW.state
       OR (OLD.state, NEW.state) IN (
            ('queued', 'running'), ('queued', 'cancelled'),
            ('running', 'succeeded'), ('running', 'queued'),
            ('running', 'failed'), ('running', 'cancelled')) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'illegal sa_job transition % -> % for job %', OLD.state, NEW.state, OLD.id
        USING ERRCODE = 'check_violation', CONSTRAINT = 'sa_job_transition_legal';
END;
$$;

CREATE OR REPLACE TRIGGER sa_job_guard BEFORE INSERT OR UPDATE ON public.sa_job FOR EACH ROW EXECUTE FUNCTION sa_job_guard_transition();
