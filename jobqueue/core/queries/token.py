"""Statements on sa_api_token."""

__all__ = ["TOKEN_GET_ACTIVE", "TOKEN_INSERT", "TOKEN_LIST_ACTIVE_MANY", "TOKEN_REVOKE",
           "TOKEN_REVOKED_CHANNEL", "TOKEN_REVOKED_LISTEN"]

TOKEN_REVOKED_CHANNEL = "sa_token_revoked"
"""NOTIFY channel TOKEN_REVOKE signals on, with the token's SHA-256 digest in hex as payload.

Web processes LISTEN on it to drop a revoked token from their cache at once
(jobqueue.core.tokens.Authenticator); a token revoked by hand-written SQL instead of `revoke-token`
is noticed when the cache entry's short lifetime ends.
"""

TOKEN_REVOKED_LISTEN = f"LISTEN {TOKEN_REVOKED_CHANNEL}"

TOKEN_INSERT = """
INSERT INTO sa_api_token (token_hash, org_id, user_id, label, expires_at, scopes)
VALUES (%(token_hash)s, %(org_id)s, %(user_id)s, %(label)s, %(expires_at)s, %(scopes)s)
RETURNING id, expires_at, scopes
"""

# served by sa_api_token_hash_unique (token_hash). Returns the stored digest too, so the caller
# can compare it with the presented one in constant time (see jobqueue.core.tokens.Authenticator), and
# the seconds until it expires (NULL: never), which bound how long a cache may keep it.
TOKEN_GET_ACTIVE = """
SELECT org_id, user_id, scopes, token_hash,
       extract(epoch FROM expires_at - now())::float8 AS expires_in
  FROM sa_api_token
 WHERE token_hash = %s
   AND revoked_at IS NULL
   AND (expires_at IS NULL OR expires_at > now())
"""

# served by sa_api_token_hash_unique (token_hash): which of the digests behind a web process's
# open SSE streams still act; the streams of any other digest end (service/events/).
TOKEN_LIST_ACTIVE_MANY = """
SELECT token_hash
  FROM sa_api_token
 WHERE token_hash = ANY(%(token_hashes)s)
   AND revoked_at IS NULL
   AND (expires_at IS NULL OR expires_at > now())
"""

# served by sa_api_token_pkey (id) or sa_api_token_hash_unique (token_hash): the caller
# passes one of `id` and `token_hash`, the other NULL. A token already revoked keeps its first
# revocation time; `newly` says whether this call revoked it. Every match is announced on
# TOKEN_REVOKED_CHANNEL (delivered at commit, so a listener never forgets a token too early).
TOKEN_REVOKE = """
WITH target AS (
    SELECT id, revoked_at FROM sa_api_token
     WHERE id = %(id)s OR token_hash = %(token_hash)s
       FOR UPDATE
), revoked AS (
    UPDATE sa_api_token t
       SET revoked_at = coalesce(target.revoked_at, now())
      FROM target
     WHERE t.id = target.id
    RETURNING t.id, t.org_id, t.user_id, t.revoked_at, t.token_hash,
              target.revoked_at IS NULL AS newly
)
SELECT id, org_id, user_id, revoked_at, newly,
       pg_notify('sa_token_revoked', encode(token_hash, 'hex')) IS NULL AS notified
  FROM revoked
"""
