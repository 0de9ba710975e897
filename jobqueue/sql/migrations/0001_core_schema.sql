-- Core schema: entities, edges, ledger, audit, jobs, job events, API tokens,
-- and the triggers that make the database itself guard the job state machine.

CREATE TABLE sa_schema_migration (
    name        text PRIMARY KEY,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE sa_api_token (
    id          bigserial PRIMARY KEY,
    token_hash  bytea NOT NULL,
    org_id      bigint NOT NULL,
    user_id     bigint NOT NULL,
    label       text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz,
    revoked_at  timestamptz,
    CONSTRAINT sa_api_token_hash_unique UNIQUE (token_hash),
    CONSTRAINT sa_api_token_hash_length CHECK (octet_length(token_hash) = 32)
);

CREATE TABLE sa_entity (
    id              uuid PRIMARY KEY,
    kind            text NOT NULL,
    org_id          bigint NOT NULL,
    created_by      bigint NOT NULL,
    parent_id       uuid REFERENCES sa_entity (id),
    correlation_id  uuid NOT NULL,
    causation_id    uuid,
    content         text NOT NULL,
    source_refs     jsonb NOT NULL DEFAULT '[]'::jsonb,
    truth_class     text,
    state_class     text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT sa_entity_kind_valid CHECK (kind IN ('prompt', 'response'))
);
CREATE INDEX sa_entity_org_parent_idx ON sa_entity (org_id, parent_id);
CREATE INDEX sa_entity_org_updated_idx ON sa_entity (org_id, updated_at);

CREATE TABLE sa_edge (
    id          bigserial PRIMARY KEY,
    org_id      bigint NOT NULL,
    kind        text NOT NULL DEFAULT 'flows-to',
    from_id     uuid NOT NULL REFERENCES sa_entity (id),
    to_id       uuid NOT NULL REFERENCES sa_entity (id),
    created_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT sa_edge_kind_valid CHECK (kind IN ('flows-to')),
    CONSTRAINT sa_edge_unique UNIQUE (from_id, to_id, kind)
);
CREATE INDEX sa_edge_to_idx ON sa_edge (to_id);

CREATE TABLE sa_job (
    id                    uuid PRIMARY KEY,
    prompt_id             uuid NOT NULL REFERENCES sa_entity (id),
    state                 text NOT NULL DEFAULT 'queued',
    priority              smallint NOT NULL DEFAULT 50,
    attempt               smallint NOT NULL DEFAULT 1,
    max_attempts          smallint NOT NULL DEFAULT 3,
    execution_options     jsonb NOT NULL DEFAULT '{}'::jsonb,
    worker_claim          text,
    claimed_at            timestamptz,
    started_at            timestamptz,
    running_heartbeat_at  timestamptz,
    finished_at           timestamptz,
    response_id           uuid REFERENCES sa_entity (id) DEFERRABLE INITIALLY DEFERRED,
    error_kind            text,
    error_message         text,
    supersedes            uuid REFERENCES sa_job (id),
    org_id                bigint NOT NULL,
    created_by            bigint NOT NULL,
    scheduled_for         timestamptz NOT NULL DEFAULT now(),
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT sa_job_state_valid CHECK (
        state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled', 'superseded')),
    CONSTRAINT sa_job_priority_range CHECK (priority BETWEEN 0 AND 100),
    CONSTRAINT sa_job_max_attempts_range CHECK (max_attempts BETWEEN 1 AND 100),
    CONSTRAINT sa_job_attempt_range CHECK (attempt BETWEEN 1 AND max_attempts),
    CONSTRAINT sa_job_worker_claim_length CHECK (char_length(worker_claim) <= 64),
    CONSTRAINT sa_job_options_object CHECK (jsonb_typeof(execution_options) = 'object'),
    CONSTRAINT sa_job_error_kind_valid CHECK (error_kind IN (
        'timeout', 'rate_limit', 'provider_5xx', 'provider_4xx', 'parse', 'auth',
        'worker_crash', 'stuck', 'unknown')),
    CONSTRAINT sa_job_running_has_claim CHECK (state <> 'running' OR worker_claim IS NOT NULL),
    CONSTRAINT sa_job_succeeded_has_response CHECK (state <> 'succeeded' OR response_id IS NOT NULL)
);
-- NOTE: serves the claim statement (JOB_CLAIM_MANY); partial so finished rows cost it nothing.
CREATE INDEX sa_job_claim_idx ON sa_job (priority, scheduled_for) WHERE state = 'queued';
CREATE INDEX sa_job_prompt_idx ON sa_job (prompt_id, created_at);
CREATE INDEX sa_job_worker_claim_idx ON sa_job (worker_claim) WHERE state = 'running';
CREATE INDEX sa_job_org_user_state_idx ON sa_job (org_id, created_by, state);
CREATE INDEX sa_job_heartbeat_idx ON sa_job (running_heartbeat_at) WHERE state = 'running';
CREATE INDEX sa_job_org_updated_idx ON sa_job (org_id, updated_at);
CREATE UNIQUE INDEX sa_job_supersedes_unique ON sa_job (supersedes) WHERE supersedes IS NOT NULL;

CREATE TABLE sa_job_event (
    id            bigserial PRIMARY KEY,
    job_id        uuid NOT NULL,
    prompt_id     uuid NOT NULL,
    org_id        bigint NOT NULL,
    created_by    bigint NOT NULL,
    from_state    text,
    to_state      text NOT NULL,
    attempt       smallint NOT NULL,
    worker_claim  text,
    error_kind    text,
    response_id   uuid,
    at            timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX sa_job_event_job_idx ON sa_job_event (job_id, id);
CREATE INDEX sa_job_event_org_user_idx ON sa_job_event (org_id, created_by, id);

CREATE TABLE sa_ledger (
    id             bigserial PRIMARY KEY,
    org_id         bigint NOT NULL,
    job_id         uuid NOT NULL REFERENCES sa_job (id) ON DELETE CASCADE,
    attempt        smallint NOT NULL,
    model          text NOT NULL,
    tokens_in      integer,
    tokens_out     integer,
    latency_ms     integer NOT NULL,
    http_status    smallint,
    outcome        text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sa_ledger_job_idx ON sa_ledger (job_id);

CREATE TABLE sa_audit (
    id          bigserial PRIMARY KEY,
    org_id      bigint NOT NULL,
    actor_id    bigint,
    action      text NOT NULL,
    entity_id   uuid,
    job_id      uuid,
    detail      jsonb NOT NULL DEFAULT '{}'::jsonb,
    at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sa_audit_job_idx ON sa_audit (job_id);

-- NOTE: clock_timestamp(), not now(): /mission/recent hands out cursors bounded by the
-- start of the oldest open transaction, which is only safe when a row's stamp is taken
-- at write time (never earlier than the moment it became possible to write it).
CREATE FUNCTION sa_touch_updated_at() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.updated_at := clock_timestamp();
    RETURN NEW;
END;
$$;

CREATE TRIGGER sa_entity_touch BEFORE UPDATE ON sa_entity
    FOR EACH ROW EXECUTE FUNCTION sa_touch_updated_at();
CREATE TRIGGER sa_job_touch BEFORE UPDATE ON sa_job
    FOR EACH ROW EXECUTE FUNCTION sa_touch_updated_at();

-- The state machine of spec section 3, enforced for code and operator SQL alike.
CREATE FUNCTION sa_job_guard_transition() RETURNS trigger LANGUAGE plpgsql AS $$
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

CREATE TRIGGER sa_job_guard BEFORE INSERT OR UPDATE ON sa_job
    FOR EACH ROW EXECUTE FUNCTION sa_job_guard_transition();

-- One event row per transition (creation included) and a NOTIFY carrying its id, so
-- workers wake up and SSE streams replay from one ordered log.
CREATE FUNCTION sa_job_record_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    event_id bigint;
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
            NEW.attempt, NEW.worker_claim, NEW.error_kind, NEW.response_id)
    RETURNING id INTO event_id;
    PERFORM pg_notify('sa_job_event', json_build_object(
        'id', event_id, 'job_id', NEW.id, 'org_id', NEW.org_id, 'created_by', NEW.created_by,
        'to_state', NEW.state, 'scheduled_for', NEW.scheduled_for)::text);
    RETURN NULL;
END;
$$;

CREATE TRIGGER sa_job_event_log AFTER INSERT OR UPDATE OF state ON sa_job
    FOR EACH ROW EXECUTE FUNCTION sa_job_record_event();
