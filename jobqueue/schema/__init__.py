"""The schema: migrations applied in order, and today's database functions and triggers."""
