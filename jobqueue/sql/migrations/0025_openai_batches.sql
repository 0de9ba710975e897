-- The OpenAI-compatible Batch API (issue 26): files, batches and one row per batch request.

-- A file: an uploaded batch input (purpose 'batch') or a batch's output or error file
-- ('batch_output'), owned by one org. Its bytes live in sa_file_chunk, in order. A file is
-- visible once `complete` (an upload still streaming, or one whose web process died, is not; the
-- retention removes the latter). `lines` counts its non-blank lines (an input's requests).
CREATE TABLE sa_file (
    id          uuid PRIMARY KEY,
    org_id      bigint NOT NULL,
    created_by  bigint NOT NULL,
    purpose     text NOT NULL,
    filename    text NOT NULL,
    bytes       bigint NOT NULL DEFAULT 0,
    lines       integer NOT NULL DEFAULT 0,
    complete    boolean NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz,
    CONSTRAINT sa_file_purpose_valid CHECK (purpose IN ('batch', 'batch_output')),
    CONSTRAINT sa_file_filename_length CHECK (char_length(filename) BETWEEN 1 AND 255),
    CONSTRAINT sa_file_size_valid CHECK (bytes >= 0 AND lines >= 0)
);
-- NOTE: serves the org's file list (newest first, keyset on (created_at, id)), its storage sum
-- (SA_ORG_MAX_FILE_BYTES), and every lookup's org check after the primary key.
CREATE INDEX sa_file_org_created_idx ON sa_file (org_id, created_at, id);
-- NOTE: serves the retention's removal of expired files (oldest first) and abandoned uploads.
CREATE INDEX sa_file_expires_idx ON sa_file (expires_at);
CREATE INDEX sa_file_incomplete_idx ON sa_file (created_at) WHERE NOT complete;

-- A file's bytes in pieces, read back in `seq` order by the primary key. An upload's pieces are
-- all FILE_CHUNK_BYTES long but the last (jobqueue/engine/files.py), so a byte offset names its
-- piece; an output file's pieces are as long as each write made them.
-- NOTE: STORAGE EXTERNAL: JSONL compresses well, but pglz costs more CPU per MB than the upload
-- does; a piece is stored out of line, uncompressed, and read back without decompression.
CREATE TABLE sa_file_chunk (
    file_id  uuid NOT NULL REFERENCES sa_file (id) ON DELETE CASCADE,
    seq      integer NOT NULL,
    data     bytea NOT NULL,
    CONSTRAINT sa_file_chunk_pkey PRIMARY KEY (file_id, seq)
);
ALTER TABLE sa_file_chunk ALTER COLUMN data SET STORAGE EXTERNAL;

-- A batch: OpenAI's batch object, and where the keeper (jobqueue/runtime/batch_keeper.py) is in
-- its work. `read_bytes`/`read_lines` say how far the input file was validated, `written_line`
-- how far the output files were written (both resume after a crash); `ends_as` is the status a
-- finalizing batch ends in. A keeper works on a batch only while it holds its lease
-- (`lease`, until `lease_until`), so two keepers never work on one batch.
-- NOTE: no foreign key to sa_file: the input file may be deleted or expire while its batch runs
-- (its lines are already rows here) and the batch's record outlives its output files.
CREATE TABLE sa_batch (
    id                uuid PRIMARY KEY,
    org_id            bigint NOT NULL,
    created_by        bigint NOT NULL,
    input_file_id     uuid NOT NULL,
    endpoint          text NOT NULL,
    completion_window text NOT NULL,
    metadata          jsonb,
    output_ttl        integer,
    status            text NOT NULL DEFAULT 'validating',
    ends_as           text,
    total             integer NOT NULL DEFAULT 0,
    completed         integer NOT NULL DEFAULT 0,
    failed            integer NOT NULL DEFAULT 0,
    tokens_in         bigint NOT NULL DEFAULT 0,
    tokens_out        bigint NOT NULL DEFAULT 0,
    read_bytes        bigint NOT NULL DEFAULT 0,
    read_lines        integer NOT NULL DEFAULT 0,
    written_line      integer NOT NULL DEFAULT 0,
    output_file_id    uuid,
    error_file_id     uuid,
    errors            jsonb,
    lease             uuid,
    lease_until       timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    in_progress_at    timestamptz,
    expires_at        timestamptz NOT NULL,
    finalizing_at     timestamptz,
    completed_at      timestamptz,
    failed_at         timestamptz,
    expired_at        timestamptz,
    cancelling_at     timestamptz,
    cancelled_at      timestamptz,
    CONSTRAINT sa_batch_status_valid CHECK (status IN (
        'validating', 'in_progress', 'finalizing', 'completed', 'expired', 'cancelling',
        'cancelled', 'failed')),
    CONSTRAINT sa_batch_ends_as_valid CHECK (ends_as IN ('completed', 'cancelled', 'expired')),
    CONSTRAINT sa_batch_counts_valid CHECK (total >= 0 AND completed >= 0 AND failed >= 0)
);
-- NOTE: serves the org's batch list (newest first, keyset on (created_at, id)).
CREATE INDEX sa_batch_org_created_idx ON sa_batch (org_id, created_at, id);
-- NOTE: serves the keeper's lease of unfinished batches and the per-org count of them
-- (SA_ORG_MAX_ACTIVE_BATCHES): finished batches cost neither anything.
CREATE INDEX sa_batch_active_idx ON sa_batch (org_id, created_at)
    WHERE status IN ('validating', 'in_progress', 'cancelling', 'finalizing');
-- NOTE: serves the retention of finished batches.
CREATE INDEX sa_batch_created_idx ON sa_batch (created_at);

-- One row per line of a batch's input: `pending` (valid, not yet a job: the backlog the keeper
-- feeds in as its org's bulk lane has room), `fed` (its job exists), then how it ended:
-- `succeeded`, `failed`, `cancelled` (by the batch's cancel) or `expired` (by its window), or
-- `invalid` (the line could not be run; `error` says why and it goes to the error file).
-- `text` and `options` (the job's prompt and execution options) are kept only until fed.
CREATE TABLE sa_batch_request (
    batch_id   uuid NOT NULL REFERENCES sa_batch (id) ON DELETE CASCADE,
    line       integer NOT NULL,
    custom_id  text,
    state      text NOT NULL,
    text       text,
    options    jsonb,
    job_id     uuid,
    error      jsonb,
    CONSTRAINT sa_batch_request_pkey PRIMARY KEY (batch_id, line),
    CONSTRAINT sa_batch_request_state_valid CHECK (state IN (
        'pending', 'fed', 'succeeded', 'failed', 'cancelled', 'expired', 'invalid')),
    CONSTRAINT sa_batch_request_custom_id_length CHECK (char_length(custom_id) <= 512)
);
-- NOTE: a custom_id is unique within its batch: a repeat is stored `invalid` (the error file
-- names it), so the index leaves invalid rows out.
CREATE UNIQUE INDEX sa_batch_request_custom_id_unique ON sa_batch_request (batch_id, custom_id)
    WHERE state <> 'invalid';
-- NOTE: serve the keeper's walks of a batch's backlog (in line order) and of its jobs in flight;
-- the rows already ended cost neither anything.
CREATE INDEX sa_batch_request_pending_idx ON sa_batch_request (batch_id, line)
    WHERE state = 'pending';
CREATE INDEX sa_batch_request_fed_idx ON sa_batch_request (batch_id, line)
    WHERE state = 'fed';
