"""Statements on sa_idempotency_key (the key row itself is written by PROMPT_INSERT_WITH_JOB)."""

__all__ = ["IDEMPOTENCY_KEY_DELETE_EXPIRED_MANY", "IDEMPOTENCY_KEY_GET_LIVE", "ORG_ENQUEUE_LOCK"]

# served by sa_idempotency_key_pkey (org_id, user_id, key) (0004_idempotency.sql). A key
# older than `ttl` seconds is treated as absent, exactly as the enqueue statement treats it.
IDEMPOTENCY_KEY_GET_LIVE = """
SELECT request_hash, prompt_id, job_id, created_at, batch_prompt_ids, batch_job_ids
  FROM sa_idempotency_key
 WHERE org_id = %(org_id)s AND user_id = %(user_id)s AND key = %(key)s
   AND created_at > now() - make_interval(secs => %(ttl)s)
"""

# served by sa_idempotency_key_created_idx (created_at) (0004_idempotency.sql). Deletes at
# most `limit` expired keys, oldest first; the caller repeats until a short page.
IDEMPOTENCY_KEY_DELETE_EXPIRED_MANY = """
DELETE FROM sa_idempotency_key k
 USING (SELECT org_id, user_id, key
          FROM sa_idempotency_key
         WHERE created_at <= now() - make_interval(secs => %(ttl)s)
         ORDER BY created_at
         LIMIT %(limit)s
           FOR UPDATE SKIP LOCKED) expired
 WHERE (k.org_id, k.user_id, k.key) = (expired.org_id, expired.user_id, expired.key)
"""

# NOTE: a transaction-scoped advisory lock per org, taken before the enqueue statement when the
# queued cap is on. It serializes one org's submits from the count to the commit, so two of them
# cannot both see "one slot left" (the enqueue statement, run after the lock is granted, takes a
# fresh snapshot and so counts every job committed before). Other orgs never wait on it. The
# key is a 64-bit hash of a namespaced name, so it cannot meet the maintenance or migration locks
# (32-bit `hashtext` keys of other names) except by a 1-in-2^64 accident.
ORG_ENQUEUE_LOCK = (
    "SELECT pg_advisory_xact_lock(hashtextextended('sa-core enqueue org ' || %(org_id)s::text, 0))"
)
