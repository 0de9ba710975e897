"""The worker process: claim loop, executor, batched completer, provider adapter, maintenance."""
