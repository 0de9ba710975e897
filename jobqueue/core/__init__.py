"""Shared foundations: states, policy, errors, settings, metrics, logs, database access, statements."""
