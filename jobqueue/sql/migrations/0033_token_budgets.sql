-- Token budgets (issue 27, part A): reservations held against a route's window, and the tokens
-- each org used recently, for the claim that shares routes fairly by tokens.
--
-- `reserved` is what the calls of this window that have not reported yet hold: their estimate
-- is already in `tokens` (so the tokens-per-window limit counts them before they are sent), and
-- is replaced by their reported usage when they settle, or taken back when they fail.
ALTER TABLE sa_route_window ADD COLUMN reserved bigint NOT NULL DEFAULT 0;

-- Tokens each org's calls used (in flight: their estimate), per window of SA_ROUTE_LIMIT_WINDOW, written by the workers
-- only when SA_FAIR_BY_TOKENS is on. Windows older than the previous one are deleted as the
-- next one starts, so an org holds two or three rows. The claim probes it by its primary key,
-- once per org with queued work.
CREATE TABLE sa_org_token_window (
    org_id       bigint NOT NULL,
    window_start timestamptz NOT NULL,
    tokens       bigint NOT NULL DEFAULT 0,
    calls        integer NOT NULL DEFAULT 0,
    PRIMARY KEY (org_id, window_start)
);
