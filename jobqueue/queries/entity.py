"""Statements on sa_entity (prompts and responses) and the enqueue that writes a prompt with its job."""

__all__ = ["ENTITY_GET", "PROMPT_INSERT_WITH_JOB"]

# NOTE: one statement, so enqueue costs one round trip and is atomic in autocommit mode.
# The parent must exist in the caller's org (sa_entity primary key); when it does not, no
# row is written and nothing is returned. A prompt inherits its thread's correlation id.
PROMPT_INSERT_WITH_JOB = """
WITH parent AS (
    SELECT id, correlation_id
      FROM sa_entity
     WHERE id = %(parent_id)s AND org_id = %(org_id)s
), prompt AS (
    INSERT INTO sa_entity (id, kind, org_id, created_by, parent_id, correlation_id,
                           causation_id, content)
    SELECT %(prompt_id)s, 'prompt', %(org_id)s, %(user_id)s, %(parent_id)s,
           coalesce((SELECT correlation_id FROM parent), %(prompt_id)s),
           %(parent_id)s, %(text)s
     WHERE %(parent_id)s::uuid IS NULL OR EXISTS (SELECT 1 FROM parent)
    RETURNING id
)
INSERT INTO sa_job (id, prompt_id, priority, max_attempts, execution_options, org_id,
                    created_by, supersedes)
SELECT %(job_id)s, prompt.id, %(priority)s, %(max_attempts)s, %(options)s, %(org_id)s,
       %(user_id)s, NULL
  FROM prompt
RETURNING id, prompt_id, state, created_at
"""

# served by sa_entity_pkey (id)
ENTITY_GET = """
SELECT id, kind, parent_id, correlation_id, causation_id, content, source_refs,
       truth_class, state_class, created_by, created_at, updated_at
  FROM sa_entity
 WHERE id = %(id)s AND org_id = %(org_id)s
"""
