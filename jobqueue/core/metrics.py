"""Every Prometheus metric of the contract (docs/architecture.md), declared once; names and labels fixed."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

__all__ = [
    "CLAIM_SECONDS",
    "ENQUEUED",
    "FAILURES",
    "HTTP_REQUEST_SECONDS",
    "OLDEST_QUEUED_SECONDS",
    "PROVIDER_REQUEST_SECONDS",
    "PROVIDER_TOKENS",
    "QUEUE_DEPTH",
    "ROUTE_THROTTLED",
    "RUN_SECONDS",
    "TRANSITIONS",
    "WAIT_SECONDS",
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
