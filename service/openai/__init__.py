"""The OpenAI-compatible front door under /openai/v1: chat completions, models, files, batches."""
