-- error_kind 'invalid_options': a queued job whose execution_options the worker cannot decode
-- (written by operator SQL or an older release, e.g. {"depth": "abc"}) fails at claim with this
-- kind instead of failing the whole claim statement (which made every worker crash-loop).
ALTER TABLE sa_job DROP CONSTRAINT sa_job_error_kind_valid;
ALTER TABLE sa_job ADD CONSTRAINT sa_job_error_kind_valid CHECK (error_kind IN (
    'timeout', 'rate_limit', 'provider_5xx', 'provider_4xx', 'parse', 'auth',
    'worker_crash', 'stuck', 'unknown', 'invalid_options'));
