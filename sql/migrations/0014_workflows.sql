-- Workflows (issue 15): batch submits under one Idempotency-Key.

-- A batch's key row also holds every item's ids in input order, so a repeat of the batch answers
-- all of them; prompt_id and job_id stay those of the first item (their constraints unchanged).
-- NULL for a single-prompt key.
ALTER TABLE sa_idempotency_key
    ADD COLUMN batch_prompt_ids uuid[],
    ADD COLUMN batch_job_ids uuid[];
