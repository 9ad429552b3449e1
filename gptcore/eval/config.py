"""What an evaluation of a trained model measures: the held-out figures and samples
(`gptcore.eval.held_out`), the standard benchmarks (`gptcore.eval.benchmarks`), and the quantization
trade-off (`gptcore.eval.quant_tradeoff`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gptcore.tools.strict import Strict

# gptcore.model.quantization.METHODS, as a type a configuration can check.
QuantizationMethod = Literal["fp32", "bf16", "int8-weight-only", "int8-dynamic", "int4-weight-only"]


class BenchmarkTask(Strict):
    """One lm-evaluation-harness task the evaluate stage scores the model on (`gptcore.eval.benchmarks`)."""

    task: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,120}$",
        description="the harness's task name (hellaswag, arc_easy, ...) or one in benchmark_include_path",
    )
    limit: int | None = Field(default=None, ge=1, description="its first N examples only (None: all)")
    num_fewshot: int | None = Field(default=None, ge=0, description="examples per prompt (None: the task's)")


class EvaluateConfig(Strict):
    """The held-out evaluation of a trained model: which checkpoint, the samples it draws, and the
    standard benchmarks it is scored on."""

    checkpoint: Literal["best", "final"] = Field(
        default="best", description="the checkpoint evaluated (best: lowest validation loss)"
    )
    prompts: int = Field(default=4, ge=0, le=64, description="prompts from the test split's document starts")
    prompt_tokens: int = Field(default=16, ge=1, le=1024, description="tokens of each prompt")
    max_new_tokens: int = Field(default=48, ge=1, le=4096, description="tokens each sample continues with")
    temperature: float = Field(default=0.8, gt=0.0, le=10.0, description="of the sampled continuation")
    top_k: int | None = Field(default=50, ge=1, description="sample among the k likeliest tokens (None: all)")
    seed: int = Field(default=0, description="the sampled continuations' seed")
    batch_size: int = Field(
        default=8,
        ge=1,
        description="test windows per forward pass (wider is no faster on a CPU: bench/evaluate_passes.py)",
    )
    max_tokens: int | None = Field(
        default=None, ge=1, description="evaluate the test stream's first N tokens only (None: all)"
    )
    questions: int | None = Field(
        default=200,
        ge=1,
        description="a chat model's held-out questions answered greedily for its answer score "
        "(gptcore.eval.answers), the test split's first N (None: all)",
    )
    benchmarks: list[BenchmarkTask] = Field(
        default_factory=list, description="lm-evaluation-harness tasks scored on the model (empty: none)"
    )
    benchmark_include_path: str | None = Field(
        default=None, description="a folder of tasks in the harness's YAML format, data files beside them"
    )
    benchmark_gate: str | None = Field(
        default=None,
        pattern=r"^[^/]+/[^/]+$",
        description="<task>/<metric> of a listed benchmark: a version whose figure regressed against the "
        "champion's may not take @champion",
    )

    @model_validator(mode="after")
    def _gate_names_a_listed_task(self) -> EvaluateConfig:
        tasks = [benchmark.task for benchmark in self.benchmarks]
        if len(set(tasks)) != len(tasks):
            raise ValueError(f"benchmarks: a task is listed twice ({', '.join(tasks)}): list each once")
        if self.benchmark_gate is not None and self.benchmark_gate.split("/")[0] not in tasks:
            listed = ", ".join(tasks) or "none"
            raise ValueError(
                f"benchmark_gate {self.benchmark_gate}: its task is not in benchmarks (listed: {listed}); "
                "name <task>/<metric> of a listed task"
            )
        return self


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
    emulated_test_tokens: int = Field(
        default=2048,
        ge=1,
        description="a method this CPU only emulates (a 16-bit type without its instructions, 15-45x slower "
        "than fp32 in compute-bound work): its quality on the test stream's first N tokens, set against "
        "fp32's on the same tokens, and its speeds timed briefly, said as this CPU's conversions",
    )
