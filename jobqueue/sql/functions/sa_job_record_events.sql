-- One sa_job_event row per transition (creation included): the job history (job-details), the
-- SSE replay log (Last-Event-ID) and the source of transition figures. It records; it notifies
-- nobody (the committing process sends coalesced wake-ups: jobqueue/core/wakeup.py) and decides
-- nothing.
-- PERF: once per statement, over its transition tables: one INSERT ... SELECT for every row the
-- statement changed, where a row trigger ran a PL/pgSQL call and an INSERT per row (470 ms of
-- the 1.3 s it took to end a chain of 10,000 jobs; bench/chains.py). A statement that changes no
-- state (a heartbeat) joins its rows and writes nothing.
-- NOTE: the old and new rows are joined by hash, never by a nested loop: PL/pgSQL keeps the plan
-- it made for the first statement it saw, and a nested loop planned for a few rows took minutes
-- over the 10,000 of a chain's end (two transition tables, no index: n x n comparisons).
CREATE OR REPLACE FUNCTION sa_job_record_events() RETURNS trigger LANGUAGE plpgsql
SET enable_nestloop = off AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO sa_job_event (job_id, prompt_id, org_id, created_by, from_state, to_state,
                                  attempt, worker_claim, error_kind, response_id)
        SELECT n.id, n.prompt_id, n.org_id, n.created_by, NULL, n.state, n.attempt,
               n.worker_claim, n.error_kind, n.response_id
          FROM new_rows n;
    ELSE
        INSERT INTO sa_job_event (job_id, prompt_id, org_id, created_by, from_state, to_state,
                                  attempt, worker_claim, error_kind, response_id)
        SELECT n.id, n.prompt_id, n.org_id, n.created_by, o.state, n.state, n.attempt,
               n.worker_claim, n.error_kind, n.response_id
          FROM new_rows n JOIN old_rows o ON o.id = n.id
         WHERE o.state <> n.state;
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER sa_job_events_inserted AFTER INSERT ON public.sa_job REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION sa_job_record_events();
CREATE OR REPLACE TRIGGER sa_job_events_updated AFTER UPDATE ON public.sa_job REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION sa_job_record_events();
