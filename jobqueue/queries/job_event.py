"""Statements on sa_job_event and its notification channel."""

__all__ = ["JOB_EVENT_LISTEN"]

# NOTE: the channel name is fixed by the sa_job_record_event trigger (0001_core_schema.sql).
JOB_EVENT_LISTEN = "LISTEN sa_job_event"
