-- Fallback routes, prices and per-org budgets (issue 27, part B).
--
-- Each ledger row (one provider call) names the route that served it and what it cost in USD at
-- the route's configured prices (NULL: no price configured, or the provider reported no tokens).
-- The archive keeps the same columns, so `sa-core usage` sums archived costs too.
ALTER TABLE sa_ledger ADD COLUMN route text, ADD COLUMN cost numeric;
ALTER TABLE sa_ledger_archive ADD COLUMN route text, ADD COLUMN cost numeric;

-- The route a job's next attempt calls, set by the finalize when its route failed over (a 5xx,
-- a timeout, a long 429) to one of the route's `fallbacks`; NULL: the route the job's
-- `prefer_provider` option or its model picks.
ALTER TABLE sa_job ADD COLUMN route text;

-- What each org spent per UTC day, summed by the finalize statement as calls are written
-- (JOB_SET_STATE_IF_RUNNING_MANY), read by the submit's budget check (one probe of the primary
-- key: at most 31 days x 8 shards rows for a month) and by the workers' list of orgs past their
-- budget. PERF: `shard` (the writing backend's pid modulo 8) spreads one busy org's updates over
-- eight rows, so the finalizes of several workers do not queue on one row lock.
CREATE TABLE sa_org_spend (
    org_id bigint NOT NULL,
    day    date NOT NULL,
    shard  smallint NOT NULL,
    cost   numeric NOT NULL,
    CONSTRAINT sa_org_spend_pkey PRIMARY KEY (org_id, day, shard)
);
-- Serves the workers' ORG_SPEND_LIST_OVER_BUDGET: the current month's rows of every org.
CREATE INDEX sa_org_spend_day_idx ON sa_org_spend (day);
