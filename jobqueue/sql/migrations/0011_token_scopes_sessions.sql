-- Token scopes (the operator view's `ops`) and browser sessions (the mission page's cookie).
--
-- A token's scopes widen what it may do beyond its own org's prompts; none by default. The
-- CHECK names every scope the code knows, so a typo in hand-written SQL cannot grant nothing.
ALTER TABLE sa_api_token
    ADD COLUMN scopes text[] NOT NULL DEFAULT '{}',
    ADD CONSTRAINT sa_api_token_scopes_known CHECK (scopes <@ ARRAY['ops']::text[]);

-- A session is a short-lived stand-in for a token, held by a browser as an HttpOnly cookie
-- (service/auth.py). Only the SHA-256 digest of its random id is stored, as for tokens. It acts
-- for its token, so revoking the token ends every session opened with it at once, and deleting
-- the token deletes them.
CREATE TABLE sa_session (
    session_hash bytea PRIMARY KEY,
    token_id     bigint NOT NULL REFERENCES sa_api_token (id) ON DELETE CASCADE,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    CONSTRAINT sa_session_hash_length CHECK (octet_length(session_hash) = 32)
);
-- Serves the prune of expired sessions that every sign-in runs (SESSION_INSERT).
CREATE INDEX sa_session_expires_idx ON sa_session (expires_at);
-- Serves the ON DELETE CASCADE from sa_api_token.
CREATE INDEX sa_session_token_idx ON sa_session (token_id);
