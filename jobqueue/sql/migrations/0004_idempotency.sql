-- Idempotency keys of POST /prompt (the Idempotency-Key header), and the index behind the
-- per-org cap on queued jobs (SA_ORG_MAX_QUEUED).

-- One row per (org, user, key): the request it answered (a SHA-256 of the validated request in
-- canonical form) and the prompt and job it created. A row older than 24 h is treated as absent
-- (the enqueue statement takes it over) and may be deleted by IDEMPOTENCY_KEY_DELETE_EXPIRED_MANY.
-- NOTE: the row is written by the same statement as the prompt and the job (PROMPT_INSERT_WITH_JOB),
-- so two racing submits with one key cannot both enqueue: the primary key lets one in, the other
-- waits for it and then replays its ids.
-- NOTE: prompt_id references sa_entity (entities are never archived) so that removing a prompt
-- removes its key; job_id has no foreign key, because `archive-old-jobs` moves old jobs out of
-- sa_job and a key must not stop (or slow down) that.
CREATE TABLE sa_idempotency_key (
    org_id        bigint NOT NULL,
    user_id       bigint NOT NULL,
    key           text NOT NULL,
    request_hash  bytea NOT NULL,
    prompt_id     uuid NOT NULL REFERENCES sa_entity (id) ON DELETE CASCADE,
    job_id        uuid NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT sa_idempotency_key_pkey PRIMARY KEY (org_id, user_id, key),
    CONSTRAINT sa_idempotency_key_length CHECK (char_length(key) BETWEEN 1 AND 255),
    CONSTRAINT sa_idempotency_key_hash_length CHECK (octet_length(request_hash) = 32)
);
-- NOTE: serves the pruning of expired keys (oldest first).
CREATE INDEX sa_idempotency_key_created_idx ON sa_idempotency_key (created_at);

-- NOTE: serves the queued-cap count of PROMPT_INSERT_WITH_JOB: one org's queued jobs, and
-- nothing else, so the count costs one index range however many jobs other orgs have or
-- however many of this org's jobs are finished.
CREATE INDEX sa_job_org_queued_idx ON sa_job (org_id) WHERE state = 'queued';
