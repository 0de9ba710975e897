-- The workers that are running, each as it last said: the operator console lists the idle ones
-- too (a job's claim shows only the workers holding jobs). Each worker refreshes its row every
-- heartbeat interval and deletes it when it stops; a row left by a worker that died ages out of
-- the list (seen_at) and is pruned when another worker starts.
CREATE TABLE sa_worker (
    id         text PRIMARY KEY,
    slots      integer NOT NULL,
    busy       integer NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    seen_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT sa_worker_slots_range CHECK (slots >= 1 AND busy >= 0)
);
