"""The SSE side of the web: one reader of sa_job_event per process, fanned out to its streams.

A prompt's transition travels, in order: `log.py` reads it once per process (only ids that
`horizon.py` proves final), `hub.py` hands each page to `fanout.py` (every stream of the event's
owner and org, each a bounded `subscription.py` buffer) and to `watchers.py` (requests held by
`Prefer: wait`); `deltas.py` adds the text streamed attempts appended; `tokens.py` ends the streams
of revoked tokens. A client's stream (`stream.py`) replays what it missed (`replay.py`), then
drains its subscription, frame by frame, for as long as the client reads.
"""
