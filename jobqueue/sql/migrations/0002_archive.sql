-- Archive tables for `sa-core archive-old-jobs`, and the indexes behind the operator reads.
--
-- Archiving moves finished jobs out of the hot tables (sa_job, sa_job_event, sa_ledger) so the
-- claim, heartbeat and mission queries stay small however long the service runs. Entities
-- (prompts, responses), edges and audit rows stay where they are: they are durable knowledge
-- (spec section 4), and sa_audit has no foreign key to sa_job.
--
-- NOTE: no foreign key is dropped or altered here. A job moves together with every other job of
-- its prompt, and only when all of them are finished and unchanged since the cutoff, so
-- `sa_job.supersedes` (always a job of the same prompt: a retry copies prompt_id) never points
-- from a remaining job to an archived one. `sa_ledger.job_id ... ON DELETE CASCADE` would
-- silently drop ledger rows, so the ledger rows are moved first, in the same transaction.

-- NOTE: LIKE copies column names, types and NOT NULL, nothing else: no CHECK, no foreign key
-- and no trigger, so archived rows are frozen copies that nothing guards or notifies about. The
-- archive statements name their columns, so a later migration that adds a column to a hot table
-- keeps archiving (the new column is simply not archived until it is added here too).
CREATE TABLE sa_job_archive (
    LIKE sa_job,
    archived_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT sa_job_archive_pkey PRIMARY KEY (id)
);
-- NOTE: serves `job-details` for an archived job's prompt and the operator's per-org reads.
CREATE INDEX sa_job_archive_prompt_idx ON sa_job_archive (prompt_id, created_at);
CREATE INDEX sa_job_archive_org_created_idx ON sa_job_archive (org_id, created_at);

CREATE TABLE sa_job_event_archive (
    LIKE sa_job_event,
    archived_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT sa_job_event_archive_pkey PRIMARY KEY (id)
);
CREATE INDEX sa_job_event_archive_job_idx ON sa_job_event_archive (job_id, id);

CREATE TABLE sa_ledger_archive (
    LIKE sa_ledger,
    archived_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT sa_ledger_archive_pkey PRIMARY KEY (id)
);
CREATE INDEX sa_ledger_archive_job_idx ON sa_ledger_archive (job_id);

-- NOTE: serves `list-jobs` (newest first, optional --since; a backward scan) and the archive's
-- keyset walk over old jobs (JOB_ARCHIVE_PICK_MANY: (created_at, id) > cursor). created_at never
-- changes after insert, so this index costs one entry per job and keeps heartbeat updates
-- as cheap as before.
CREATE INDEX sa_job_created_idx ON sa_job (created_at, id);

-- NOTE: serves the time window of `queue-metrics` (events at or after --since). BRIN, not
-- btree: events are appended in `at` order, so block ranges stay narrow, and the index costs
-- almost nothing on the table every transition writes to.
CREATE INDEX sa_job_event_at_brin ON sa_job_event USING brin (at);
