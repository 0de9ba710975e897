-- LLM routes: usage over a time range, and provider rate limits shared by every worker.
--
-- `sa-core usage` sums the ledger over a time range, per org: BRIN indexes on created_at serve
-- that window on both the hot and the archive ledger. Ledger rows are only ever appended (and
-- moved whole to the archive), so their created_at follows their physical order, which is what
-- a BRIN index needs; it costs a few pages however large the ledger grows.
CREATE INDEX sa_ledger_created_brin ON sa_ledger USING brin (created_at);
CREATE INDEX sa_ledger_archive_created_brin ON sa_ledger_archive USING brin (created_at);

-- A model route the provider throttled (a 429) or that reached its configured limit: no worker
-- calls it before paused_until. One row per route ever paused, so a handful of rows.
CREATE TABLE sa_route_pause (
    route        text PRIMARY KEY,
    paused_until timestamptz NOT NULL,
    reason       text NOT NULL
);

-- Calls and tokens per route per window, counted by every worker, for the configured
-- requests- and tokens-per-minute limits. Windows older than the current one are deleted as the
-- next one starts, so a route holds one or two rows.
CREATE TABLE sa_route_window (
    route        text NOT NULL,
    window_start timestamptz NOT NULL,
    requests     integer NOT NULL DEFAULT 0,
    tokens       bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (route, window_start)
);

-- When a job was first put back because its route was throttled: past SA_THROTTLE_MAX_WAIT from
-- then, a 429 spends an attempt as any other failure, so no job waits for ever.
ALTER TABLE sa_job ADD COLUMN throttled_at timestamptz;

-- The text a streamed attempt has produced so far, one row per running job, rewritten by its
-- worker every SA_STREAM_INTERVAL (not once per delta): GET /jobs shows it, the SSE hub turns
-- its growth into `job.output_delta` events. UNLOGGED: partial text is worth nothing after a
-- crash (the attempt is retried from the start), so it costs no WAL. The finalize of the job
-- deletes its row. `seq` orders the rewrites for the hub's reader.
CREATE SEQUENCE sa_job_partial_seq;
CREATE UNLOGGED TABLE sa_job_partial (
    job_id     uuid PRIMARY KEY,
    prompt_id  uuid NOT NULL,
    org_id     bigint NOT NULL,
    created_by bigint NOT NULL,
    attempt    integer NOT NULL,
    text       text NOT NULL,
    seq        bigint NOT NULL DEFAULT nextval('sa_job_partial_seq')
);
CREATE INDEX sa_job_partial_seq_idx ON sa_job_partial (seq);
