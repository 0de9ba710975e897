-- Streamed text stored and read by delta (issue 28): each write of a streamed attempt appends one
-- row holding only what arrived since the previous one, instead of rewriting the job's whole
-- text in sa_job_partial (an append cost the length of the answer so far, and every look of the
-- SSE hub re-read it whole).
--
-- One row per write: (job_id, attempt, offset) places `text` in the attempt's answer (`offset`
-- is the attempt's length before it, in characters), and `seq` orders the writes for the hubs,
-- which read only the rows past their last look. GET /jobs assembles a running attempt's rows
-- in offset order. A worker writes every streaming job's rows of one interval in one statement
-- (jobqueue/runtime/streaming.py). UNLOGGED as before: partial text is worth nothing after a
-- crash (the attempt is retried from the start), so it costs no WAL. The job's finalize deletes
-- its rows, and the maintenance leader those of attempts that ended otherwise (a cancel, a
-- reclaim). The owner columns are copied from the job so a hub hands a row to its streams
-- without reading sa_job.
DROP TABLE sa_job_partial;
DROP SEQUENCE sa_job_partial_seq;

CREATE SEQUENCE sa_job_delta_seq;
CREATE UNLOGGED TABLE sa_job_delta (
    seq        bigint PRIMARY KEY DEFAULT nextval('sa_job_delta_seq'),
    job_id     uuid NOT NULL,
    attempt    integer NOT NULL,
    "offset"   integer NOT NULL,
    prompt_id  uuid NOT NULL,
    org_id     bigint NOT NULL,
    created_by bigint NOT NULL,
    text       text NOT NULL,
    CONSTRAINT sa_job_delta_offset_valid CHECK ("offset" >= 0)
);
ALTER SEQUENCE sa_job_delta_seq OWNED BY sa_job_delta.seq;
CREATE INDEX sa_job_delta_job_idx ON sa_job_delta (job_id, attempt, "offset");
