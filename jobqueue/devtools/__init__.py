"""Development tools: `sa-core dev`, the fake provider, the embedded Postgres."""
