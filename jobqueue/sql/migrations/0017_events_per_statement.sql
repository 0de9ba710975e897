-- The event log is written once per statement (sql/functions/sa_job_record_events.sql, over the
-- statement's transition tables), no longer once per row: the row trigger of 0001 and its
-- function go. `sa-core migrate` creates their successor right after this migration.
DROP TRIGGER sa_job_event_log ON sa_job;
DROP FUNCTION sa_job_record_event();
