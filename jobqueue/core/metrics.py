"""Every Prometheus metric, declared once: the contract's (docs/architecture.md; names and labels
fixed) and the operational figures beside it (slots, pools, streams, build)."""

from __future__ import annotations

import platform

from prometheus_client import Counter, Gauge, Histogram

from jobqueue.core.version import VERSION

__all__ = [
    "BUILD_INFO",
    "CLAIM_SECONDS",
    "DB_POOL_CONNECTIONS",
    "DB_POOL_REQUESTS_WAITING",
    "ENQUEUED",
    "FAILURES",
    "HTTP_REQUEST_SECONDS",
    "OLDEST_QUEUED_SECONDS",
    "PROVIDER_COST",
    "PROVIDER_REQUEST_SECONDS",
    "PROVIDER_TOKENS",
    "QUEUE_DEPTH",
    "ROUTE_FALLBACKS",
    "ROUTE_THROTTLED",
    "RUN_SECONDS",
    "SSE_STREAMS_OPEN",
    "TRANSITIONS",
    "WAITS_OPEN",
    "WAIT_SECONDS",
    "WEB_ONLY",
    "WORKER_ONLY",
    "WORKER_SLOTS",
]

# NOTE: spans the fake provider's microseconds and a real model's minutes.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 180,
                    600)

ENQUEUED = Counter("sa_jobs_enqueued_total", "Jobs created by a submit or a user retry.")
TRANSITIONS = Counter("sa_job_transitions_total", "Job state transitions made by this process.",
                      ["from_state", "to_state"])
FAILURES = Counter("sa_job_failures_total", "Failed attempts (retried or terminal) by error kind.",
                   ["error_kind"])
WAIT_SECONDS = Histogram("sa_job_wait_seconds", "From job creation (or due time) to claim.",
                         buckets=_LATENCY_BUCKETS)
# NOTE: an extension of the contract's list (docs/architecture.md): the claim statement's own
# duration, which must not grow with the backlog (bench/sustained.py prints it).
CLAIM_SECONDS = Histogram("sa_job_claim_seconds", "Claim statements (pool checkout and commit included).",
                          buckets=_LATENCY_BUCKETS)
RUN_SECONDS = Histogram("sa_job_run_seconds", "From claim to finalize.", buckets=_LATENCY_BUCKETS)
PROVIDER_REQUEST_SECONDS = Histogram("sa_provider_request_seconds", "Provider calls by outcome.",
                                     ["outcome"], buckets=_LATENCY_BUCKETS)
PROVIDER_TOKENS = Counter("sa_provider_tokens_total",
                          "Tokens the provider reported, by model route and direction (in, out).",
                          ["route", "direction"])
PROVIDER_COST = Counter("sa_provider_cost_total",
                        "USD spent on provider calls at the routes' configured prices, by route.",
                        ["route"])
# NOTE: an extension of the contract's list: jobs whose next attempt moved from `route` to its
# fallback `to_route` (a 5xx, a timeout, a 429 pausing the route past SA_FALLBACK_AFTER).
ROUTE_FALLBACKS = Counter("sa_route_fallbacks_total",
                          "Jobs moved from a model route to one of its fallbacks.",
                          ["route", "to_route"])
# NOTE: an extension of the contract's list: one count per throttling episode (a route that was
# running is paused), by `reason` (`429` from the provider, `limit` for a configured RPM/TPM).
ROUTE_THROTTLED = Counter("sa_route_throttled_total",
                          "Model routes paused for every worker, by route and reason.",
                          ["route", "reason"])
HTTP_REQUEST_SECONDS = Histogram("sa_http_request_seconds", "HTTP requests served.",
                                 ["route", "method", "status"], buckets=_LATENCY_BUCKETS)

# NOTE: read from the database at scrape time by the web's /metrics, so they are not registered
# globally: each scrape puts them into its own registry after setting them.
QUEUE_DEPTH = Gauge("sa_job_queue_depth", "Jobs per state, read from the database at scrape time.",
                    ["state"], registry=None)
OLDEST_QUEUED_SECONDS = Gauge("sa_job_oldest_queued_seconds",
                              "Age of the oldest claimable queued job, read at scrape time.",
                              registry=None)

# NOTE: the figures below are set by the process that owns them (jobqueue/core/exposition.py
# ProcessFigures): the web's processes every few seconds and before each scrape they answer, a
# worker before each scrape. "liveall" keeps one series per live web process (label pid); a
# worker process is its own target, so it has no pid label.
WORKER_SLOTS = Gauge("sa_worker_slots", "Job slots of this worker process: busy (a provider call "
                     "in flight) or free (claimable now).", ["state"])
DB_POOL_CONNECTIONS = Gauge("sa_db_pool_connections", "Connections of a pool (psycopg_pool "
                            "get_stats): open, idle (available) and max.", ["pool", "state"],
                            multiprocess_mode="liveall")
DB_POOL_REQUESTS_WAITING = Gauge("sa_db_pool_requests_waiting",
                                 "Callers waiting for a connection of the pool right now.", ["pool"],
                                 multiprocess_mode="liveall")
SSE_STREAMS_OPEN = Gauge("sa_sse_streams_open", "Event streams (GET /mission/events) open now.",
                         multiprocess_mode="livesum")
WAITS_OPEN = Gauge("sa_waits_open", "Requests holding their connection to wait for a job now "
                   "(Prefer: wait), out of SA_WAIT_MAX per process.", multiprocess_mode="livesum")
BUILD_INFO = Gauge("sa_build_info", "Always 1; labels say which sa-core and Python run.",
                   ["version", "python"], multiprocess_mode="max")
BUILD_INFO.labels(version=VERSION, python=platform.python_version()).set(1)

WEB_ONLY = frozenset({"sa_http_request_seconds", "sa_jobs_enqueued", "sa_sse_streams_open",
                      "sa_waits_open"})
"""Families only the web produces (names as prometheus-client reports them, counters without
`_total`): a worker's page leaves them out instead of showing them empty."""

WORKER_ONLY = frozenset({"sa_worker_slots"})
"""Families only a worker produces; the web's page leaves them out."""
