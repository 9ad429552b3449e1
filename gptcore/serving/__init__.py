"""Serving a model to many clients at once: batched decoding behind an OpenAI-compatible HTTP API."""
