"""The readiness probe's statement."""

__all__ = ["HEALTH_PING"]

HEALTH_PING = "SELECT 1"
