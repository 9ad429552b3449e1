"""Compiling the training step: auto where it pays, a probe at start-up, its cost its own figure, the
trajectory unchanged; and the attention kernel named."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from gptcore.errors import TrainingError
from gptcore.model.gpt import GPT
from gptcore.runtime.attention import NAMES, attention_backend
from gptcore.runtime.config import DeviceDefaults, RuntimeConfig
from gptcore.runtime.device import resolve_compile, resolve_runtime
from gptcore.train import compile as compile_module
from gptcore.train.compile import compile_for_training
from gptcore.train.trainer import train
from tests.test_trainer import TINY, Recorder, job


def compiled_job(tmp_path: Path | None = None, **changes):
    runtime = RuntimeConfig(device="cpu", precision="fp32", batch_size=8, compile=True)
    return job(tmp_path, runtime=runtime, training={"max_steps": 8, "checkpoint_every": 4}, **changes)


def test_auto_compiles_on_cuda_only_and_says_why() -> None:
    assert resolve_compile("auto", "cuda") == (True, "auto: on for CUDA")
    assert resolve_compile("auto", "cpu") == (False, "auto: off on cpu, where compiling does not pay")
    assert resolve_compile(True, "cpu") == (True, "requested")
    assert resolve_compile(False, "cuda") == (False, "requested")
    assert RuntimeConfig().compile == "auto"


def test_the_attention_kernel_is_the_dispatchers_answer() -> None:
    assert attention_backend(TINY, "cpu", torch.float32) in NAMES.values()
    startup = Recorder()
    train(job(training={"max_steps": 1}), startup)
    assert startup.of("start")[0]["attention_backend"] == attention_backend(TINY, "cpu", torch.float32)


@pytest.mark.slow(seconds=40)
def test_a_compiled_run_trains_as_eager_does_and_resumes_bit_for_bit(tmp_path: Path) -> None:
    eager, compiled = Recorder(), Recorder()
    train(job(tmp_path / "eager", training={"max_steps": 8, "checkpoint_every": 4}), eager)
    summary = train(compiled_job(tmp_path / "compiled"), compiled)
    start = compiled.of("start")[0]
    assert summary.recompilations == 0, "evaluation runs the uncompiled model; every step has one shape"
    assert summary.compile_seconds == start["compile_seconds"]
    assert start["compile"] is True and start["compile_source"] == "requested"
    assert start["compile_seconds"] > 0, "compiled by the start-up probe, before the first step"
    for (step, mine), (_, theirs) in zip(compiled.losses(), eager.losses(), strict=True):
        assert mine == pytest.approx(theirs, abs=1e-4), step

    broken, resumed = Recorder(stop_at=6), Recorder()
    with pytest.raises(KeyboardInterrupt):
        train(compiled_job(tmp_path / "broken"), broken)
    train(compiled_job(tmp_path / "broken", resume=True), resumed)
    assert resumed.losses() == compiled.losses()[4:], (
        "the probe leaves weights, gradients and RNG as they were"
    )


@pytest.mark.slow
def test_activation_checkpointing_trains_compiled_as_it_does_eager() -> None:
    runtime = RuntimeConfig(device="cpu", precision="fp32", batch_size=8, activation_checkpointing=True)
    eager, compiled = Recorder(), Recorder()
    train(job(runtime=runtime, training={"max_steps": 4}), eager)
    train(job(runtime=runtime.model_copy(update={"compile": True}), training={"max_steps": 4}), compiled)
    assert compiled.of("start")[0]["compile"] and compiled.of("start")[0]["activation_checkpointing"]
    for (step, mine), (_, theirs) in zip(compiled.losses(), eager.losses(), strict=True):
        assert mine == pytest.approx(theirs, abs=1e-4), step


def test_running_out_of_memory_while_compiling_gets_the_out_of_memory_response(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class OutOfMemory(torch.nn.Module):
        def forward(self, *args, **kwargs):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB")

    monkeypatch.setattr(compile_module.torch, "compile", lambda module: OutOfMemory())
    failures = Recorder()
    with pytest.raises(TrainingError) as caught:
        train(compiled_job(), failures)
    message = str(caught.value)
    assert message.startswith("out of memory on cpu at batch size 8, sequence length 16")
    assert "Tried to allocate 3.00 GiB" in message and "try --batch-size 4 --grad-accum 2" in message
    assert failures.of("start") == [], "it stopped before training started"


def test_a_run_that_is_not_compiled_reports_no_compile_figures() -> None:
    eager = Recorder()
    summary = train(job(training={"max_steps": 2}), eager)
    start = eager.of("start")[0]
    assert (
        start["compile"] is False
        and start["compile_source"] == "auto: off on cpu, where compiling does not pay"
    )
    assert start["compile_seconds"] is None and "recompilations" not in summary.to_dict()


class Broken(torch.nn.Module):
    def forward(self, *args, **kwargs):
        raise RuntimeError("BackendCompilerFailed: no C compiler\nmore lines")


@pytest.mark.parametrize("source", ["auto: on for CUDA", "requested"])
def test_a_compiler_that_fails_at_start_up_trains_eager_under_auto_and_stops_when_asked(
    monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    monkeypatch.setattr(compile_module.torch, "compile", lambda module: Broken())
    model = GPT(TINY)
    runtime = resolve_runtime(
        RuntimeConfig(device="cpu", compile=True), lambda d: DeviceDefaults(batch_size=2)
    )
    runtime = replace(runtime, compile_source=source)
    if source == "requested":
        with pytest.raises(
            TrainingError, match=r"^runtime.compile: the compiler failed at start-up \(RuntimeError: "
        ):
            compile_for_training(model, runtime, 2, TINY.block_size, TINY.vocab_size)
        return
    module, after, seconds = compile_for_training(model, runtime, 2, TINY.block_size, TINY.vocab_size)
    assert module is model and seconds is None and after.compile is False
    assert after.compile_source == (
        "auto: on for CUDA, but the compiler failed at start-up (RuntimeError: BackendCompilerFailed: "
        "no C compiler): eager"
    )
