"""Statements on sa_api_token."""

__all__ = [
    "TOKEN_GET_ACTIVE",
    "TOKEN_INSERT",
    "TOKEN_LIST_ACTIVE_MANY",
    "TOKEN_REVOKE",
    "TOKEN_REVOKE_BY_HASH",
]

TOKEN_INSERT = """
INSERT INTO sa_api_token (token_hash, org_id, user_id, label, expires_at)
VALUES (%(token_hash)s, %(org_id)s, %(user_id)s, %(label)s, %(expires_at)s)
RETURNING id, expires_at
"""

# served by sa_api_token_hash_unique (token_hash). Returns the stored digest too, so the caller
# can compare it with the presented one in constant time (see jobqueue.core.tokens.authenticate).
TOKEN_GET_ACTIVE = """
SELECT org_id, user_id, token_hash
  FROM sa_api_token
 WHERE token_hash = %s
   AND revoked_at IS NULL
   AND (expires_at IS NULL OR expires_at > now())
"""

# served by sa_api_token_hash_unique (token_hash): which of the digests behind a web process's
# open SSE streams still act; the streams of any other digest end (service/event_hub.py).
TOKEN_LIST_ACTIVE_MANY = """
SELECT token_hash
  FROM sa_api_token
 WHERE token_hash = ANY(%(token_hashes)s)
   AND revoked_at IS NULL
   AND (expires_at IS NULL OR expires_at > now())
"""

# served by sa_api_token_pkey (id) or sa_api_token_hash_unique (token_hash): the caller
# passes one of `id` and `token_hash`, the other NULL. A token already revoked keeps its first
# revocation time; `newly` says whether this call revoked it.
TOKEN_REVOKE = """
WITH target AS (
    SELECT id, revoked_at FROM sa_api_token
     WHERE id = %(id)s OR token_hash = %(token_hash)s
       FOR UPDATE
)
UPDATE sa_api_token t
   SET revoked_at = coalesce(target.revoked_at, now())
  FROM target
 WHERE t.id = target.id
RETURNING t.id, t.org_id, t.user_id, t.revoked_at, target.revoked_at IS NULL AS newly
"""

# served by sa_api_token_hash_unique (token_hash); as TOKEN_REVOKE_BY_ID.
TOKEN_REVOKE_BY_HASH = """
WITH target AS (
    SELECT id, revoked_at FROM sa_api_token WHERE token_hash = %(token_hash)s FOR UPDATE
)
UPDATE sa_api_token t
   SET revoked_at = coalesce(target.revoked_at, now())
  FROM target
 WHERE t.id = target.id
RETURNING t.id, t.org_id, t.user_id, t.revoked_at, target.revoked_at IS NULL AS newly
"""
