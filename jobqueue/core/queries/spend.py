"""Statements on sa_org_spend: what each org spent per UTC day, for the per-org budgets.

The finalize statement adds to it (JOB_SET_STATE_IF_RUNNING_MANY's `spend`); these read it.
"""

__all__ = ["ORG_SPEND_DELETE_OLD_MANY", "ORG_SPEND_GET", "ORG_SPEND_LIST_OVER_BUDGET"]

# served by sa_org_spend_pkey (org_id, day, shard) (0031_route_costs.sql): one range of the
# org's key, this month's days (31 x 8 shards at most). The submit's budget check; `now` is the
# caller's clock (NULL: the database's), so a test can move it. The day and month are UTC.
ORG_SPEND_GET = """
SELECT coalesce(sum(cost) FILTER (
           WHERE day = (coalesce(%(now)s::timestamptz, now()) AT TIME ZONE 'UTC')::date), 0)::float8
           AS day_cost,
       coalesce(sum(cost), 0)::float8 AS month_cost
  FROM sa_org_spend
 WHERE org_id = %(org_id)s
   AND day >= date_trunc('month', coalesce(%(now)s::timestamptz, now()) AT TIME ZONE 'UTC')::date
"""

# served by sa_org_spend_day_idx (day) (0031_route_costs.sql): this month's rows of every org
# (orgs that spent x days x 8 shards), grouped by org. The orgs at or past a budget (0: none);
# the workers pass them over in the claim (JOB_CLAIM_MANY's `held_orgs`).
ORG_SPEND_LIST_OVER_BUDGET = """
SELECT org_id
  FROM sa_org_spend
 WHERE day >= date_trunc('month', coalesce(%(now)s::timestamptz, now()) AT TIME ZONE 'UTC')::date
 GROUP BY org_id
HAVING (%(daily)s::float8 > 0 AND coalesce(sum(cost) FILTER (
            WHERE day = (coalesce(%(now)s::timestamptz, now()) AT TIME ZONE 'UTC')::date), 0)
            >= %(daily)s::float8)
    OR (%(monthly)s::float8 > 0 AND sum(cost) >= %(monthly)s::float8)
"""

# served by sa_org_spend_day_idx (day): the retention's removal, `limit` rows at a time, of the
# days before last month (no budget reads them; the ledger keeps every call's cost for good).
ORG_SPEND_DELETE_OLD_MANY = """
DELETE FROM sa_org_spend s
 USING (SELECT org_id, day, shard FROM sa_org_spend
         WHERE day < (date_trunc('month', now() AT TIME ZONE 'UTC') - interval '1 month')::date
         ORDER BY day
         LIMIT %(limit)s) doomed
 WHERE (s.org_id, s.day, s.shard) = (doomed.org_id, doomed.day, doomed.shard)
"""
