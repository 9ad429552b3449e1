"""What a completions server (`gptcore.serving.app`) allows: its batch, its queue, its limits, its key."""

from __future__ import annotations

from pydantic import Field

from gptcore.tools.strict import Strict

STEP_TOKENS = 256  # tokens one step runs at most by default: a decode of 64 rows and 192 prompt tokens


class ServeConfig(Strict):
    """The limits of `gptpipe serve`: every request beyond them is refused in one sentence, never queued
    without end, never left computing for a client that is gone."""

    max_batch: int = Field(default=64, ge=1, le=1024, description="sequences decoded together at most")
    step_tokens: int = Field(
        default=STEP_TOKENS, ge=2, description="tokens one step runs at most: the batch's next tokens, then "
        "prompt tokens (a longer prompt goes in over several steps); more than max_batch",
    )  # fmt: skip
    max_queue: int = Field(
        default=256, ge=0, description="sequences waiting for a row at most; beyond them 429 and Retry-After"
    )
    max_tokens_cap: int = Field(default=1024, ge=1, description="the most new tokens one prompt may ask for")
    max_prompts: int = Field(default=32, ge=1, description="prompts in one request at most")
    max_body_bytes: int = Field(default=1_000_000, ge=1024, description="a request body's size at most (413)")
    request_timeout: float = Field(
        default=60.0, gt=0, description="seconds a request may take; then its sequences stop (504)"
    )
    api_key: str | None = Field(
        default=None, repr=False, description="the bearer token every request but /health must carry"
    )
