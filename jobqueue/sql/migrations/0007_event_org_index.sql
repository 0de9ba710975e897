-- The org-wide reads of the event log (GET /mission/recent?scope=org, /mission/events?scope=org)
-- page one org's events in id order; sa_job_event_org_user_idx serves only one user's.
CREATE INDEX sa_job_event_org_idx ON sa_job_event (org_id, id);
