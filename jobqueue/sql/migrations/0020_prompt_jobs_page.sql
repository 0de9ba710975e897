-- GET /prompts/{id} pages a prompt's jobs by keyset, newest first: ORDER BY created_at DESC, id
-- (JOB_LIST_FOR_PROMPT_PAGE). The prompt index now holds that order whole, so a page walks its
-- own entries and stops at its LIMIT; with (prompt_id, created_at) alone the id needed a sort,
-- and on statistics that took one prompt for most of the table the planner walked
-- sa_job_created_idx instead: every job of every prompt newer than the page.
-- NOTE: the same name, a wider key: every statement served by sa_job_prompt_idx still is
-- (MISSION_PROMPTS_LATEST and JOB_RETRY_LATEST_FOR_PROMPT_IF_FINISHED take the same order).
CREATE INDEX sa_job_prompt_page_idx ON sa_job (prompt_id, created_at DESC, id);
DROP INDEX sa_job_prompt_idx;
ALTER INDEX sa_job_prompt_page_idx RENAME TO sa_job_prompt_idx;
