"""Statements on sa_org_token_window: the tokens each org used recently, for the fair claim by
tokens (SA_FAIR_BY_TOKENS; the claim's read is in queries/claim.py)."""

__all__ = ["ORG_TOKEN_WINDOW_ADD"]

# served by sa_org_token_window_pkey (org_id, window_start). Adds tokens and calls to an org's
# current window (`window` seconds long, aligned on 2000-01-01 UTC as the routes' windows are):
# a call's estimate when it is admitted, then the difference to its reported usage (or minus
# the estimate, and the call, when it failed), so calls in flight count at once. Deletes the
# org's windows older than the previous one on the way (the claim weighs the current and the
# previous window: "recent").
ORG_TOKEN_WINDOW_ADD = """
WITH w AS (
    SELECT date_bin(make_interval(secs => %(window)s), now(),
                    TIMESTAMPTZ '2000-01-01 00:00:00+00') AS start
), old AS (
    DELETE FROM sa_org_token_window
     WHERE org_id = %(org_id)s
       AND window_start < (SELECT start FROM w) - make_interval(secs => %(window)s)
)
INSERT INTO sa_org_token_window AS o (org_id, window_start, tokens, calls)
SELECT %(org_id)s, start, %(tokens)s, %(calls)s FROM w
ON CONFLICT (org_id, window_start) DO UPDATE
   SET tokens = o.tokens + EXCLUDED.tokens, calls = o.calls + EXCLUDED.calls
"""
