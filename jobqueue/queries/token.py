"""Statements on sa_api_token."""

__all__ = ["TOKEN_GET_ACTIVE", "TOKEN_INSERT"]

TOKEN_INSERT = """
INSERT INTO sa_api_token (token_hash, org_id, user_id, label, expires_at)
VALUES (%(token_hash)s, %(org_id)s, %(user_id)s, %(label)s, %(expires_at)s)
RETURNING id
"""

# served by sa_api_token_hash_unique (token_hash)
TOKEN_GET_ACTIVE = """
SELECT org_id, user_id
  FROM sa_api_token
 WHERE token_hash = %s
   AND revoked_at IS NULL
   AND (expires_at IS NULL OR expires_at > now())
"""
