"""sa-core's client library: `sa_core.client.Client` and `AsyncClient` for the HTTP API."""

from sa_core.client import ApiError, AsyncClient, Client, Event, Result, Submitted, WaitTimeout

__all__ = ["ApiError", "AsyncClient", "Client", "Event", "Result", "Submitted", "WaitTimeout"]
