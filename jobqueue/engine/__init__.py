"""The job lifecycle against the database: enqueue, claim, finalize, control, reclaim."""
