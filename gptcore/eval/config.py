"""What an evaluation of a trained model measures: the held-out figures and samples
(`gptcore.eval.held_out`), and the quantization trade-off (`gptcore.eval.quant_tradeoff`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gptcore.tools.strict import Strict

# gptcore.model.quantization.METHODS, as a type a configuration can check.
QuantizationMethod = Literal["fp32", "bf16", "int8-weight-only", "int8-dynamic", "int4-weight-only"]


class EvaluateConfig(Strict):
    """The held-out evaluation of a trained model: which checkpoint, and the samples it draws."""

    checkpoint: Literal["best", "final"] = Field(
        default="best", description="the checkpoint evaluated (best: lowest validation loss)"
    )
    prompts: int = Field(default=4, ge=0, le=64, description="prompts from the test split's document starts")
    prompt_tokens: int = Field(default=16, ge=1, le=1024, description="tokens of each prompt")
    max_new_tokens: int = Field(default=48, ge=1, le=4096, description="tokens each sample continues with")
    temperature: float = Field(default=0.8, gt=0.0, le=10.0, description="of the sampled continuation")
    top_k: int | None = Field(default=50, ge=1, description="sample among the k likeliest tokens (None: all)")
    seed: int = Field(default=0, description="the sampled continuations' seed")
    batch_size: int = Field(default=8, ge=1, description="test windows per forward pass")
    max_tokens: int | None = Field(
        default=None, ge=1, description="evaluate the test stream's first N tokens only (None: all)"
    )


class QuantizeConfig(Strict):
    """Post-training quantization of a trained model, one row of a trade-off table per method; fp32, the
    reference, is always measured."""

    methods: list[QuantizationMethod] = Field(
        default_factory=list, description="the methods to measure; empty: nothing is measured"
    )
    max_test_tokens: int | None = Field(
        default=None, ge=1, description="measure the test stream's first N tokens only (None: all)"
    )
    new_tokens: int = Field(default=128, ge=1, le=1024, description="greedy tokens per timed generation")
    repeats: int = Field(default=5, ge=1, le=50, description="timed generations; the median is kept")
