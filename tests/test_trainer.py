"""The trainer: learns, runs each precision, accumulates exactly, resumes bit for bit, measures."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gptcore.checkpoint.files import load_checkpoint
from gptcore.data.batches import StepPlan, open_examples
from gptcore.data.shards import SplitShards
from gptcore.data.synthetic import synthetic_stream
from gptcore.data.tokenfile import TokenFileManifest, write_manifest
from gptcore.errors import CheckpointError, ConfigError, TrainingError
from gptcore.model.config import ModelConfig
from gptcore.model.gpt import GPT
from gptcore.model.size import ModelSize
from gptcore.runtime.config import DeviceDefaults, RuntimeConfig
from gptcore.runtime.device import resolve_runtime
from gptcore.train.callbacks import TrainingCallback
from gptcore.train.config import OptimizerConfig, TrainingConfig
from gptcore.train.job import TrainJob
from gptcore.train.records import EvalRecord, StartupRecord, StepRecord
from gptcore.train.setup import planned_steps
from gptcore.train.step import accumulate_gradients
from gptcore.train.trainer import train

TINY = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=300)
TRAIN = synthetic_stream(300, 17 * 400, seed=1)
VALIDATION = synthetic_stream(300, 17 * 32, seed=2, split="validation")


class Recorder(TrainingCallback):
    def __init__(self, stop_at: int | None = None) -> None:
        self.events: list[tuple[str, Any]] = []
        self.stop_at = stop_at

    def on_start(self, startup: StartupRecord) -> None:
        self.events.append(("start", startup.to_dict()))

    def on_step(self, record: StepRecord) -> None:
        self.events.append(("step", record.to_dict()))
        if record.step == self.stop_at:
            raise KeyboardInterrupt  # an interruption between checkpoints

    def on_eval(self, record: EvalRecord) -> None:
        self.events.append(("eval", record.to_dict()))

    def on_checkpoint(self, path: Path, info: dict[str, Any]) -> None:
        self.events.append(("checkpoint", info))

    def on_failure(self, reason: str) -> None:
        self.events.append(("failure", reason))

    def of(self, kind: str) -> list[Any]:
        return [payload for event, payload in self.events if event == kind]

    def losses(self) -> list[tuple[int, float]]:
        return [(m["step"], m["train_loss"]) for m in self.of("step")]


def job(tmp_path: Path | None = None, **changes: Any) -> TrainJob:
    runtime = changes.pop("runtime", RuntimeConfig(device="cpu", precision="fp32", batch_size=8))
    training = dict(
        max_steps=12,
        log_every=1,
        eval_every=6,
        checkpoint_every=4,
        optimizer=OptimizerConfig(learning_rate=3e-3, warmup_steps=2),
    )
    training.update(changes.pop("training", {}))
    data = {"train_tokens": TRAIN, "validation_tokens": VALIDATION, **changes}
    return TrainJob(
        model=TINY,
        runtime=runtime,
        training=TrainingConfig(**training),
        checkpoint_directory=tmp_path,
        **data,
    )


def test_loss_falls_on_a_learnable_stream_below_the_unigram_floor() -> None:
    recorder = Recorder()
    fast = OptimizerConfig(learning_rate=1e-2, warmup_steps=5)
    summary = train(
        job(training={"epochs": 2, "max_steps": 60, "log_every": 10, "eval_every": 60, "optimizer": fast}),
        recorder,
    )
    losses = [loss for _, loss in recorder.losses()]
    assert losses[-1] < losses[0] - 1.0
    assert summary.final_val_loss < summary.unigram_val_loss
    assert recorder.of("eval")[0]["unigram_val_loss"] == summary.unigram_val_loss
    assert summary.steps == 60 and summary.tokens_per_second > 0
    # MFU is the run's FLOP/s over the peak measured at its start; both are this machine's figures of
    # the moment (a busy start measures a low peak), so the test holds the arithmetic, not a bound
    start = recorder.of("start")[0]
    expected = summary.tokens_per_second * start["flops_per_token"] / start["peak_flops"]
    assert summary.mfu == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_steps_run_and_fp16_uses_the_grad_scaler(tmp_path: Path, precision: str) -> None:
    def final_loss(precision: str, folder: Path) -> float:
        runtime = RuntimeConfig(device="cpu", precision=precision, batch_size=4)
        return train(job(folder, runtime=runtime, training={"max_steps": 3})).final_train_loss

    fp32 = final_loss("fp32", tmp_path / "fp32")
    mixed = final_loss(precision, tmp_path / precision)
    # The same three steps from the same seed: the loss fp32 computes, to autocast's rounding (~1e-4 here),
    # and not its very bits (the steps ran in the lower precision).
    assert mixed == pytest.approx(fp32, abs=0.01) and mixed != fp32
    scaler = load_checkpoint(tmp_path / precision / "final.pt")["scaler"]
    assert bool(scaler) == (precision == "fp16")
    if precision == "fp16":  # GradScaler's first scale, kept: three steps without an overflow counted
        assert (scaler["scale"], scaler["_growth_tracker"]) == (2.0**16, 3)


def _final_weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(directory / "final.pt")["model"]


def test_k_micro_batches_of_b_equal_one_batch_of_k_times_b() -> None:
    torch.manual_seed(0)
    whole, split = GPT(TINY), GPT(TINY)
    split.load_state_dict(whole.state_dict())
    runtime = resolve_runtime(
        RuntimeConfig(device="cpu", precision="fp32"), lambda d: DeviceDefaults(batch_size=8)
    )
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    window = torch.randint(0, 300, (8, 17))
    batch = [(window[:, :-1], window[:, 1:])]
    micro = [(window[i : i + 2, :-1], window[i : i + 2, 1:]) for i in range(0, 8, 2)]
    loss_whole = accumulate_gradients(whole, iter(batch), 1, runtime, scaler)
    loss_split = accumulate_gradients(split, iter(micro), 4, runtime, scaler)
    assert loss_split.item() / 4 == pytest.approx(loss_whole.item(), abs=1e-6)
    for (name, a), b in zip(whole.named_parameters(), split.parameters(), strict=True):
        assert (a.grad - b.grad).abs().max().item() <= 1e-6, name


def test_an_accumulated_run_logs_the_same_first_loss_as_one_big_batch() -> None:
    one, split = Recorder(), Recorder()
    train(
        job(runtime=RuntimeConfig(device="cpu", batch_size=8, grad_accum_steps=1), training={"max_steps": 1}),
        one,
    )
    train(
        job(runtime=RuntimeConfig(device="cpu", batch_size=2, grad_accum_steps=4), training={"max_steps": 1}),
        split,
    )
    assert split.losses()[0][1] == pytest.approx(one.losses()[0][1], abs=1e-6)


def test_an_interrupted_and_resumed_run_equals_the_uninterrupted_one_bit_for_bit(tmp_path: Path) -> None:
    whole, broken = Recorder(), Recorder(stop_at=6)
    train(job(tmp_path / "whole"), whole)
    with pytest.raises(KeyboardInterrupt):
        train(job(tmp_path / "broken"), broken)
    resumed = Recorder()
    train(job(tmp_path / "broken", resume=True), resumed)
    assert resumed.of("start")[0]["start_step"] == 4  # the last periodic checkpoint before the stop
    assert broken.losses() == whole.losses()[:6]
    assert resumed.losses() == whole.losses()[4:]  # steps 5 and 6 replayed, to the last bit
    a, b = _final_weights(tmp_path / "whole"), _final_weights(tmp_path / "broken")
    assert all(torch.equal(a[k], b[k]) for k in a)


def write_split(folder: Path, tokens: np.ndarray, shard_tokens: int | None) -> Path:
    """`tokens` as a split on disk: shards of `shard_tokens` with their manifest, or one file."""
    folder.mkdir(parents=True)
    manifest = TokenFileManifest("uint16", len(tokens), 1, 300, "", "test", "train", "", shards=None)
    if shard_tokens is None:
        tokens.astype("<u2").tofile(folder / "train.bin")
        write_manifest(folder / "train.bin", manifest)
        return folder / "train.bin"
    writer = SplitShards(folder, "train", shard_tokens, "uint16")
    writer.append(tokens.astype("<u2"), np.array([len(tokens)]), np.array([0]))
    shards = [shard.to_dict() for shard in writer.finish()]
    return write_manifest(folder / "train.manifest.json", replace(manifest, shards=shards))


def test_a_sharded_split_trains_as_one_stream_and_resumes_bit_for_bit_across_shards(tmp_path: Path) -> None:
    tokens = np.asarray(TRAIN.tokens)
    single = write_split(tmp_path / "single", tokens, None)
    sharded = write_split(tmp_path / "sharded", tokens, 1000)  # 17-token examples cross every boundary
    assert len(json.loads(sharded.read_text())["shards"]) == 7
    one_file, whole, broken, resumed = Recorder(), Recorder(), Recorder(stop_at=6), Recorder()
    train(job(tmp_path / "one", train_tokens=single), one_file)
    train(job(tmp_path / "whole", train_tokens=sharded), whole)
    assert whole.losses() == one_file.losses(), "the same examples, whichever the layout"
    with pytest.raises(KeyboardInterrupt):
        train(job(tmp_path / "broken", train_tokens=sharded), broken)
    train(job(tmp_path / "broken", train_tokens=sharded, resume=True), resumed)
    assert resumed.losses() == whole.losses()[4:]
    a, b = _final_weights(tmp_path / "whole"), _final_weights(tmp_path / "broken")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_max_tokens_sets_the_steps_from_the_global_batch() -> None:
    plan = StepPlan(batch_size=8, grad_accum_steps=2)
    examples = open_examples(TRAIN, TINY.block_size, TINY.vocab_size)
    section = TrainingConfig(max_tokens=10_000, epochs=3)
    size = ModelSize.of(TINY)
    assert planned_steps(section, examples, plan, size) == 40  # ceil(10,000 / (16 x 16))
    assert planned_steps(section.model_copy(update={"max_steps": 7}), examples, plan, size) == 7
    assert planned_steps(section.model_copy(update={"epochs": 1}), examples, plan, size) == 25  # 400 // 16


def test_a_compute_budget_sets_the_steps_from_the_models_flops_per_token() -> None:
    plan = StepPlan(batch_size=8, grad_accum_steps=2)
    examples = open_examples(TRAIN, TINY.block_size, TINY.vocab_size)
    size = ModelSize.of(TINY)
    flops = TrainingConfig(max_flops=size.flops_per_token * 10_000, epochs=3)
    assert planned_steps(flops, examples, plan, size) == 40  # 10,000 tokens, as max_tokens=10,000
    per_parameter = TrainingConfig(tokens_per_parameter=2.0, epochs=3)
    steps = -(-2 * size.parameter_count // 256)  # whole steps of 16 x 16 tokens
    assert planned_steps(per_parameter, examples, plan, size) == min(steps, 3 * 25)
    both = flops.model_copy(update={"max_tokens": 2_560})  # the least of the budgets wins
    assert planned_steps(both, examples, plan, size) == 10


def test_resume_with_a_different_config_is_refused_naming_the_keys(tmp_path: Path) -> None:
    train(job(tmp_path, training={"max_steps": 4}))
    changed = job(
        tmp_path, resume=True, training={"max_steps": 4, "optimizer": OptimizerConfig(learning_rate=1e-2)}
    )
    with pytest.raises(CheckpointError, match=r"optimizer\.learning_rate: 0\.003 -> 0\.01"):
        train(changed)


def test_resume_without_a_checkpoint_starts_at_step_zero(tmp_path: Path) -> None:
    recorder = Recorder()
    train(job(tmp_path / "fresh", resume=True, training={"max_steps": 2}), recorder)
    assert recorder.of("start")[0]["start_step"] == 0 and recorder.of("start")[0]["resumed_from"] is None


def test_dry_run_reports_everything_trains_nothing_writes_nothing(tmp_path: Path) -> None:
    recorder = Recorder()
    directory = tmp_path / "checkpoints"
    summary = train(job(directory, dry_run=True), recorder)
    startup = recorder.of("start")[0]
    for key in (
        "processor",
        "gpu_name",
        "gpu_memory_bytes",
        "torch_version",
        "cuda_available",
        "device",
        "precision",
        "tensor_cores_enabled",
        "tf32_enabled",
        "fused_adamw",
        "batch_size",
        "grad_accum_steps",
        "workers",
        "sequence_length",
        "parameter_count",
        "max_steps",
        "planned_tokens",
        "estimated_peak_memory_bytes",
        "steps_per_epoch",
        "flop_formula",
    ):
        assert key in startup, key
    assert startup["steps_per_epoch"] == 400 // 8 and startup["planned_tokens"] == 12 * 8 * 16
    assert summary.steps == 0 and recorder.of("step") == [] and not directory.exists()


def test_dry_run_needs_no_token_files_but_training_does() -> None:
    summary = train(job(dry_run=True, train_tokens=None, validation_tokens=None))
    assert summary.steps == 0
    with pytest.raises(ConfigError, match="--train-tokens"):
        train(job(train_tokens=None))


ALLOCATION_FAILURES = [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: can't allocate memory: you tried"),
]


@pytest.mark.parametrize("failure", ALLOCATION_FAILURES, ids=["cuda-allocator", "cpu-allocator"])
def test_out_of_memory_stops_with_the_response_and_keeps_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: BaseException
) -> None:
    from gptcore.model import gpt as model_module

    real_forward = model_module.GPT.forward
    calls = {"n": 0}

    def forward_then_oom(self: Any, *args: Any) -> Any:
        calls["n"] += 1
        if calls["n"] > 5:  # past the checkpoint at step 4
            raise failure
        return real_forward(self, *args)

    monkeypatch.setattr(model_module.GPT, "forward", forward_then_oom)
    recorder = Recorder()
    with pytest.raises(TrainingError) as caught:
        train(job(tmp_path, runtime=RuntimeConfig(device="cpu", batch_size=8, grad_accum_steps=1)), recorder)
    message = str(caught.value)
    assert message.startswith("out of memory on cpu at batch size 8, sequence length 16 (host memory ran out")
    assert str(failure) in message  # what the allocator said
    assert "try --batch-size 4 --grad-accum 2" in message and "the same effective batch of 8" in message
    assert "record the change" in message and "fresh --checkpoint-directory unless deliberately" in message
    assert "\n" not in message and recorder.of("failure") == [message]
    assert (tmp_path / "step-00000004.pt").is_file() and "step-00000004.pt is intact" in message
    assert load_checkpoint(tmp_path / "step-00000004.pt")["step"] == 4  # and loads


def test_periodic_best_and_final_checkpoints_are_reported(tmp_path: Path) -> None:
    recorder = Recorder()
    summary = train(job(tmp_path, metadata={"mlflow_run_id": "abc"}), recorder)
    kinds = [(info["kind"], info["step"]) for info in recorder.of("checkpoint")]
    assert ("step", 4) in kinds and ("step", 8) in kinds and ("final", 12) in kinds and ("best", 6) in kinds
    assert summary.final_checkpoint == str(tmp_path / "final.pt") and summary.checkpoint_save_seconds > 0
    from gptcore.checkpoint.files import checkpoint_metadata

    assert checkpoint_metadata(tmp_path / "final.pt").metadata["mlflow_run_id"] == "abc"
