"""Operator commands: the `sa-core` CLI, inspection, archive, migrations, tokens."""
