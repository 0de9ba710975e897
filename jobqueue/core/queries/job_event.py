"""Statements on sa_job_event and its notification channel."""

__all__ = [
    "JOB_EVENT_LISTEN",
    "JOB_EVENT_LIST_AFTER",
    "JOB_EVENT_LIST_FOR_ORG_BETWEEN",
    "JOB_EVENT_LIST_FOR_USER_BETWEEN",
    "JOB_EVENT_LIST_LEFT_RUNNING_AFTER",
    "JOB_EVENT_NOTIFY_MANY",
    "JOB_EVENT_SEQUENCE_LAST",
    "JOB_EVENT_WRITERS_HOLDING",
    "JOB_QUEUED_LISTEN",
]

# NOTE: channel names and payloads were fixed by the event trigger
# (0005_notify_channels.sql); since 0006_notify_out_of_band.sql the processes that commit
# transitions send them (jobqueue/core/wakeup.py). Every transition wakes sa_job_event (empty payload);
# a job becoming queued also wakes sa_job_queued (empty when claimable now, else scheduled_for in
# epoch seconds).
JOB_EVENT_LISTEN = "LISTEN sa_job_event"
JOB_QUEUED_LISTEN = "LISTEN sa_job_queued"

# No table: one notifying transaction (one commit) for a whole coalesced batch of wake-ups,
# `channels[i]` with `payloads[i]`. Postgres folds repeated (channel, payload) pairs itself.
# NOTE: no synchronous_commit = off here: it made no difference to notify-only commits. Three
# threads sending these back to back made 3,700-7,600 commits/s with it on, 6,600-6,800 with it
# off, next to 8 enqueuers at 1,260-2,080/s either way.
JOB_EVENT_NOTIFY_MANY = """
SELECT pg_notify(n.channel, n.payload)
  FROM unnest(%(channels)s::text[], %(payloads)s::text[]) AS n(channel, payload)
"""

# NOTE: a succeeded event carries its response's text (one sa_entity_pkey probe), so a viewer
# needs no second request for the answer; at most `text_chars` characters of it travel in a
# feed, `response_truncated` saying when the rest stays behind (GET /responses/{id} has it
# whole). octet_length() of the whole text reads its stored size only, never the text.
_EVENT_SELECT = """
e.id, e.job_id, e.prompt_id, e.org_id, e.created_by, e.from_state, e.to_state, e.attempt,
e.error_kind, e.response_id, e.at, r.text AS response_text,
coalesce(r.truncated, false) AS response_truncated"""

_EVENT_FROM = """
  FROM sa_job_event e
  LEFT JOIN LATERAL (
       SELECT t.text, octet_length(c.content) > octet_length(t.text) AS truncated
         FROM sa_entity c
        CROSS JOIN LATERAL (SELECT substr(c.content, 1, %(text_chars)s) AS text) t
        WHERE c.id = e.response_id) r ON true"""

# served by sa_job_event_pkey (id), 0001_core_schema.sql: the SSE hub's one reader for every
# client of a web process; it pages by keyset.
JOB_EVENT_LIST_AFTER = "SELECT" + _EVENT_SELECT + _EVENT_FROM + """
 WHERE e.id > %(after)s
 ORDER BY e.id
 LIMIT %(limit)s
"""

# served by sa_job_event_pkey (id), 0001_core_schema.sql: each worker's departure watch
# (jobqueue/engine/departures.py), a keyset walk from its cursor over the last moments of the
# log, stopped by the LIMIT. Only the job ids of transitions out of `running` come back (any
# canceller's, SQL included); the worker keeps those it holds and checks them by id.
# PERF: no index on from_state: every transition would pay for it, and the walk only covers
# the events since the last poll (about half a second of them). The range is closed at the
# sequence's last value the look read (`upto`): an open `id > $1` is a third of the table to a
# generic plan, which then reads it by bitmap and sorts it.
JOB_EVENT_LIST_LEFT_RUNNING_AFTER = """
SELECT e.id, e.job_id
  FROM sa_job_event e
 WHERE e.id > %(after)s AND e.id <= %(upto)s AND e.from_state = 'running'
 ORDER BY e.id
 LIMIT %(limit)s
"""

# NOTE: a replay page also stops once the texts before an event pass `max_bytes` (the event
# that passes it still comes: a page is never empty), so a stream that does not read holds one
# page of bounded size; the next page starts after the last event sent. An event's text counts
# for its stored size, at most what `text_chars` characters can take in UTF-8, read without
# reading the text; only the events kept have their text cut and read.
_REPLAY_HEAD = """
SELECT page.id, page.job_id, page.prompt_id, page.org_id, page.created_by, page.from_state,
       page.to_state, page.attempt, page.error_kind, page.response_id, page.at,
       r.text AS response_text, coalesce(r.truncated, false) AS response_truncated
  FROM (SELECT e.*, sum(coalesce(s.size, 0)) OVER (ORDER BY e.id) - coalesce(s.size, 0)
                    AS bytes_before
          FROM sa_job_event e
          LEFT JOIN LATERAL (
               SELECT least(octet_length(c.content), 4 * %(text_chars)s) AS size
                 FROM sa_entity c
                WHERE c.id = e.response_id) s ON true"""

_REPLAY_TAIL = """
           AND e.id > %(after)s AND e.id <= %(upto)s
         ORDER BY e.id
         LIMIT %(limit)s) page
  LEFT JOIN LATERAL (
       SELECT t.text, octet_length(c.content) > octet_length(t.text) AS truncated
         FROM sa_entity c
        CROSS JOIN LATERAL (SELECT substr(c.content, 1, %(text_chars)s) AS text) t
        WHERE c.id = page.response_id) r ON true
 WHERE page.bytes_before < %(max_bytes)s
 ORDER BY page.id
"""

# served by sa_job_event_org_user_idx (org_id, created_by, id), 0001_core_schema.sql: the
# Last-Event-ID replay of one client. `upto` is the hub's delivered cursor when the client
# registered, below which every id is final (see jobqueue/core/horizon.py).
JOB_EVENT_LIST_FOR_USER_BETWEEN = _REPLAY_HEAD + """
 WHERE e.org_id = %(org_id)s AND e.created_by = %(user_id)s""" + _REPLAY_TAIL

# served by sa_job_event_org_idx (org_id, id), 0007_event_org_index.sql: as
# JOB_EVENT_LIST_FOR_USER_BETWEEN, for a client that opted in to its whole org's events.
JOB_EVENT_LIST_FOR_ORG_BETWEEN = _REPLAY_HEAD + """
 WHERE e.org_id = %(org_id)s""" + _REPLAY_TAIL

# The last id handed out by the event sequence (0 before the first), read outside MVCC: a
# sequence advances for every transaction at once, committed or not.
# NOTE: must run as its own statement BEFORE JOB_EVENT_WRITERS_HOLDING (see jobqueue/core/horizon.py).
JOB_EVENT_SEQUENCE_LAST = """
SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence('sa_job_event', 'id')::regclass), 0)
       AS last_id
"""

# The transactions that may still commit an event: those holding RowExclusiveLock on
# sa_job_event (every inserter takes it before its id and keeps it to its end), prepared ones
# included (pid NULL). pg_locks, unlike pg_stat_activity's xact_start, is shown to every role,
# and lists fast-path locks too. A session that wrote only elsewhere, or reads the log, is not
# here, so it cannot hold the horizon back.
JOB_EVENT_WRITERS_HOLDING = """
SELECT coalesce(array_agg(DISTINCT virtualtransaction), '{}') AS holders,
       coalesce(bool_or(pid IS NULL), false) AS prepared
  FROM pg_locks
 WHERE locktype = 'relation'
   AND relation = 'sa_job_event'::regclass
   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND mode = 'RowExclusiveLock'
   AND granted
"""
