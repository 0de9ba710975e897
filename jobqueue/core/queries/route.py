"""Statements on sa_route_pause and sa_route_window: provider rate limits shared by every worker."""

__all__ = ["ROUTE_PAUSE", "ROUTE_PAUSES_ACTIVE", "ROUTE_PAUSE_SET", "ROUTE_RESUME", "ROUTE_STATES",
           "ROUTE_WINDOW_ADD_TOKENS", "ROUTE_WINDOW_RESERVE", "ROUTE_WINDOW_SETTLE",
           "ROUTE_WINDOW_TAKE"]

# served by sa_route_pause_pkey (route). Pauses a route until `seconds` from now, or leaves a
# later pause as it is (GREATEST): many workers meeting the same 429 agree on one end. Answers
# the seconds left and whether the route was running before (a new throttling episode).
ROUTE_PAUSE = """
WITH before AS (
    SELECT paused_until FROM sa_route_pause WHERE route = %(route)s
)
INSERT INTO sa_route_pause AS p (route, paused_until, reason)
VALUES (%(route)s, now() + make_interval(secs => %(seconds)s), %(reason)s)
ON CONFLICT (route) DO UPDATE
   SET paused_until = GREATEST(p.paused_until, EXCLUDED.paused_until),
       reason = CASE WHEN EXCLUDED.paused_until > p.paused_until THEN EXCLUDED.reason
                     ELSE p.reason END
RETURNING extract(epoch FROM p.paused_until - now())::float8 AS seconds,
          NOT EXISTS (SELECT 1 FROM before WHERE before.paused_until > now()) AS started
"""

# NOTE: a sequential read of one row per route ever paused (a handful): no index needed.
ROUTE_PAUSES_ACTIVE = """
SELECT route, extract(epoch FROM paused_until - now())::float8 AS seconds
  FROM sa_route_pause
 WHERE paused_until > now()
"""

# NOTE: the window a call falls in: `window` seconds long, aligned on 2000-01-01 UTC.
_WINDOW_START = ("date_bin(make_interval(secs => %(window)s), now(), "
                 "TIMESTAMPTZ '2000-01-01 00:00:00+00')")

# NOTE: the head of ROUTE_WINDOW_TAKE and ROUTE_WINDOW_RESERVE: the current window (`w`), and
# the route's earlier windows deleted on the way (one or two rows); `taken` follows.
_WINDOW_HEAD = (
    """
WITH w AS (
    SELECT """
    + _WINDOW_START
    + """ AS start
), old AS (
    DELETE FROM sa_route_window
     WHERE route = %(route)s AND window_start < (SELECT start FROM w)
), taken AS ("""
)

# served by sa_route_window_pkey (route, window_start). Counts one call in the route's current
# window if the window is under both limits (0: none); answers `allowed` and the seconds left in
# the window. Concurrent workers serialize on the window's row, so the limit holds exactly. The
# route's earlier windows are deleted on the way (one or two rows).
ROUTE_WINDOW_TAKE = (
    _WINDOW_HEAD
    + """
    INSERT INTO sa_route_window AS r (route, window_start, requests)
    SELECT %(route)s, start, 1 FROM w
    ON CONFLICT (route, window_start) DO UPDATE
       SET requests = r.requests + 1
     WHERE (%(rpm)s = 0 OR r.requests < %(rpm)s) AND (%(tpm)s = 0 OR r.tokens < %(tpm)s)
    RETURNING r.requests
)
SELECT EXISTS (SELECT 1 FROM taken) AS allowed,
       extract(epoch FROM (SELECT start FROM w) + make_interval(secs => %(window)s) - now())::float8
           AS seconds_left
"""
)

# served by sa_route_window_pkey (route, window_start). Adds the tokens a call reported to the
# route's current window, for its tokens-per-minute limit.
ROUTE_WINDOW_ADD_TOKENS = (
    """
INSERT INTO sa_route_window AS r (route, window_start, tokens)
VALUES (%(route)s, """
    + _WINDOW_START
    + """, %(tokens)s)
ON CONFLICT (route, window_start) DO UPDATE SET tokens = r.tokens + EXCLUDED.tokens
"""
)

# served by sa_route_pause_pkey (route). An operator's pause: exactly `seconds` from now, shorter
# than a pause the provider caused if the operator says so (unlike ROUTE_PAUSE's GREATEST).
ROUTE_PAUSE_SET = """
INSERT INTO sa_route_pause AS p (route, paused_until, reason)
VALUES (%(route)s, now() + make_interval(secs => %(seconds)s), %(reason)s)
ON CONFLICT (route) DO UPDATE SET paused_until = EXCLUDED.paused_until, reason = EXCLUDED.reason
RETURNING paused_until
"""

# served by sa_route_pause_pkey (route). Ends a route's pause now; answers whether it was paused.
ROUTE_RESUME = """
UPDATE sa_route_pause
   SET paused_until = now(), reason = %(reason)s
 WHERE route = %(route)s AND paused_until > now()
RETURNING route
"""

# NOTE: sequential reads of a handful of rows (one pause per route ever paused, one or two
# windows per limited route): no index needed. Every route with a pause or a window, with its
# pause (if still on) and its current window's counts.
ROUTE_STATES = (
    """
WITH w AS (
    SELECT """
    + _WINDOW_START
    + """ AS start
)
SELECT r.route,
       p.paused_until, p.reason,
       coalesce(extract(epoch FROM p.paused_until - now()), 0)::float8 AS paused_seconds,
       cw.window_start, coalesce(cw.requests, 0) AS requests, coalesce(cw.tokens, 0) AS tokens
  FROM (SELECT route FROM sa_route_pause UNION SELECT route FROM sa_route_window) r
  LEFT JOIN sa_route_pause p ON p.route = r.route AND p.paused_until > now()
  LEFT JOIN sa_route_window cw ON cw.route = r.route AND cw.window_start = (SELECT start FROM w)
 ORDER BY r.route
"""
)

# served by sa_route_window_pkey (route, window_start). ROUTE_WINDOW_TAKE with a token budget:
# counts one call and reserves its estimate (`tokens`, also held in `reserved` until it settles)
# when the window has room for both, so a burst of long prompts stops at the limit before it is
# sent, not after its usage is reported. A window with no tokens yet takes one call however
# large (else a call larger than the limit would wait for ever). Answers `allowed`, the seconds
# left and the window the reservation is held in (its settle goes there). Concurrent workers
# serialize on the window's row, so the limit holds exactly. Earlier windows deleted on the way.
ROUTE_WINDOW_RESERVE = (
    _WINDOW_HEAD
    + """
    INSERT INTO sa_route_window AS r (route, window_start, requests, tokens, reserved)
    SELECT %(route)s, start, 1, %(tokens)s, %(tokens)s FROM w
    ON CONFLICT (route, window_start) DO UPDATE
       SET requests = r.requests + 1,
           tokens = r.tokens + EXCLUDED.tokens,
           reserved = r.reserved + EXCLUDED.reserved
     WHERE (%(rpm)s = 0 OR r.requests < %(rpm)s)
       AND (%(tpm)s = 0 OR r.tokens = 0 OR r.tokens + EXCLUDED.tokens <= %(tpm)s)
    RETURNING r.requests
)
SELECT EXISTS (SELECT 1 FROM taken) AS allowed,
       (SELECT start FROM w) AS window_start,
       extract(epoch FROM (SELECT start FROM w) + make_interval(secs => %(window)s) - now())::float8
           AS seconds_left
"""
)

# served by sa_route_window_pkey (route, window_start). Settles a reservation in the window it
# was made in: its estimate out, the tokens the call reported in (0 for a failed call: the
# reservation is released). A window already gone (the call outlived it) has nothing to settle.
ROUTE_WINDOW_SETTLE = """
UPDATE sa_route_window
   SET tokens = greatest(0, tokens - %(reserved)s + %(used)s),
       reserved = greatest(0, reserved - %(reserved)s)
 WHERE route = %(route)s AND window_start = %(window_start)s
"""
