"""Statements on sa_session: the mission page's short-lived browser sessions (migration 0011)."""

__all__ = ["SESSION_DELETE", "SESSION_DELETE_OLDEST_FOR_TOKEN", "SESSION_GET_ACTIVE",
           "SESSION_INSERT"]

# served by sa_api_token_hash_unique (token_hash) for the token, and by sa_session_expires_idx
# (expires_at) for the prune of expired sessions, which keeps the table as small as the number of
# live sessions without a maintenance loop. A session never outlives its token's own expiry.
# No row comes back when the token is not active (revoked or expired meanwhile). The token's row
# stays locked to the end of the transaction, so its sign-ins take turns and
# SESSION_DELETE_OLDEST_FOR_TOKEN, next in the same transaction, sees every other one; NOWAIT,
# so a sign-in that would wait for another of the same token fails at once (lock_not_available)
# instead of holding a pooled connection while it waits.
SESSION_INSERT = """
WITH pruned AS (
    DELETE FROM sa_session WHERE expires_at <= now()
)
INSERT INTO sa_session (session_hash, token_id, expires_at)
SELECT %(session_hash)s, id,
       least(now() + make_interval(secs => %(ttl)s), coalesce(expires_at, 'infinity'))
  FROM sa_api_token
 WHERE token_hash = %(token_hash)s
   AND revoked_at IS NULL
   AND (expires_at IS NULL OR expires_at > now())
   FOR UPDATE NOWAIT
RETURNING expires_at
"""

# served by sa_api_token_hash_unique (token_hash), then sa_session_token_idx (token_id): the
# token's other sessions, at most SA_SESSIONS_PER_TOKEN of them (every sign-in trims them),
# all but the newest `keep` ended. Run after SESSION_INSERT, in its transaction.
SESSION_DELETE_OLDEST_FOR_TOKEN = """
DELETE FROM sa_session
 WHERE session_hash IN (
       SELECT s.session_hash
         FROM sa_session s
         JOIN sa_api_token t ON t.id = s.token_id
        WHERE t.token_hash = %(token_hash)s
          AND s.session_hash <> %(session_hash)s
        ORDER BY s.created_at DESC, s.session_hash
       OFFSET %(keep)s)
"""

# served by sa_session_pkey (session_hash), then sa_api_token_pkey (id). The token must still
# act: revoking it ends its sessions at the next request. Returns the token's digest, by which
# the SSE hub re-checks and caps streams (service/events/).
SESSION_GET_ACTIVE = """
SELECT t.org_id, t.user_id, t.scopes, t.token_hash,
       extract(epoch FROM s.expires_at - now())::float8 AS expires_in
  FROM sa_session s
  JOIN sa_api_token t ON t.id = s.token_id
 WHERE s.session_hash = %s
   AND s.expires_at > now()
   AND t.revoked_at IS NULL
   AND (t.expires_at IS NULL OR t.expires_at > now())
"""

# served by sa_session_pkey (session_hash).
SESSION_DELETE = """
DELETE FROM sa_session WHERE session_hash = %s
"""
