"""Memory: what a training step is estimated to need, and what the training is measured to use.

The estimate counts the bytes alive at a step's peak (the terms are written out in docs/training.md):
the fp32 weights and AdamW's two fp32 moments, the gradients, the activations the backward pass keeps
and the loss's arrays over the vocabulary. The measurement is the training's own: on CUDA the caching
allocator's peak since training started; on Linux CPUs the resident high-water mark since training
started (reset through `/proc/self/clear_refs`) minus the resident size just before the model was
built, so library imports and earlier pipeline stages are not counted. Where the high-water mark
cannot be reset the record says so instead of guessing.
"""

from __future__ import annotations

import contextlib
import importlib
import resource
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from gptcore.model.config import ModelConfig
from gptcore.model.gpt import GPT, LOSS_CHUNK_TOKENS
from gptcore.runtime import malloc as host_memory
from gptcore.runtime.decided import Runtime

_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")
RESIDUAL_BYTES = 4  # the residual stream stays fp32 under autocast: an fp32 add of a 16-bit branch
# Per layer and token, the block keeps values of width d at the activation width (`layer_activation_values`:
# 15 for GPT-2's block) and 2 of the fp32 residual stream (the norms' inputs).
RESIDUAL_VALUES = 2
# Kernel workspaces, the autograd graph, oneDNN's primitive caches: measured near 40-50 MiB whatever
# the model (the difference between the live heap and the terms above on `gpt_first_cpu`).
WORKSPACE_BYTES = 48 << 20
# glibc's heap on top of the live bytes: freed blocks of one step's arrays that the next step's do not
# fit, kept rather than returned (bench/memory_estimate.py: the resident peak over the live-heap peak
# was 1.19-1.22 for gpt_42m and gpt_100m). The CUDA figure (allocated bytes) has no such share.
HOST_ALLOCATOR_SHARE = 0.20


def activation_width(precision: str) -> int:
    """Bytes per activation value: 2 under 16-bit autocast, else 4."""
    return 2 if precision in ("bf16", "fp16") else 4


def layer_activation_values(config: ModelConfig) -> float:
    """Arrays of width n_embd one block keeps per token for its backward pass. Attention: the two norms'
    outputs (the linears' inputs), q, k, v, the attention's output and its contiguous copy (7); QK-norm
    and rotary positions each make new q and k arrays that attention keeps (2 each). The MLP, in units
    of its hidden width h: GELU's and ReLU²'s input and output (2h, the square keeping the ReLU's
    output); SwiGLU's fused gate and up (2h, alive through the views its product keeps), silu(gate) and
    the product (4h). GPT-2's block: 7 + 2 x 4 = 15."""
    attention = 7 + 2 * int(config.qk_norm) + 2 * int(config.position == "rotary")
    hidden = config.mlp_width() / config.n_embd
    return attention + (4 if config.mlp == "swiglu" else 2) * hidden


def layer_activation_bytes(config: ModelConfig, tokens: int, precision: str) -> int:
    """What one transformer block keeps for its backward pass over `tokens` tokens (no attention-score
    matrix: SDPA's kernels recompute it)."""
    width = activation_width(precision)
    values = layer_activation_values(config) * width + RESIDUAL_VALUES * RESIDUAL_BYTES
    return int(tokens * config.n_embd * values)


@dataclass(frozen=True)
class StepMemory:
    """What decides a training step's memory besides its batch: `estimate(batch, accumulation)` gives
    the bytes at its peak by term (docs/training.md). `total` is the largest of three peaks, the end of
    the forward pass (activations and the loss's arrays alive), the optimizer step (weights, gradients,
    moments) and, with checkpoints written in the background on CPU, the snapshot beside the weights
    and moments; plus the kernels' workspace and on CPU the host allocator's share."""

    config: ModelConfig
    parameters: int
    precision: str = "fp32"
    activation_checkpointing: bool = False
    device: str = "cpu"
    checkpoint_snapshot: bool = False  # a host copy of weights and moments while a checkpoint is written
    optimizer_state: int | None = None  # its bytes; None: AdamW's two fp32 moments per parameter

    @classmethod
    def for_run(
        cls,
        model: GPT,
        runtime: Runtime,
        checkpoint_snapshot: bool = False,
        optimizer_state: int | None = None,
    ) -> StepMemory:
        """The step memory of `model` trained with `runtime` (and an optimizer keeping `optimizer_state`
        bytes: Muon keeps one momentum per matrix entry where AdamW keeps two)."""
        return cls(
            model.config,
            model.parameter_count(),
            runtime.precision,
            runtime.activation_checkpointing,
            runtime.device,
            checkpoint_snapshot,
            optimizer_state,
        )

    def estimate(self, batch_size: int, grad_accum_steps: int = 1) -> dict[str, int]:
        config, parameters, precision = self.config, self.parameters, self.precision
        width = activation_width(precision)
        tokens = batch_size * config.block_size
        weights = 4 * parameters
        if precision != "fp32":
            weights += 2 * parameters  # autocast caches a 16-bit copy of each weight for the step
        gradients = 4 * parameters
        optimizer = 8 * parameters if self.optimizer_state is None else self.optimizer_state
        if self.activation_checkpointing:
            # Each block keeps only its fp32 input; the backward recomputes one block at a time, and the
            # loss one `LOSS_CHUNK_TOKENS` piece at a time (its input, ln_f's output, is kept whole).
            kept = config.n_layer * tokens * config.n_embd * RESIDUAL_BYTES
            activations = kept + layer_activation_bytes(config, tokens, precision)
            activations += tokens * config.n_embd * 2 * RESIDUAL_BYTES
            logit_tokens = min(tokens, LOSS_CHUNK_TOKENS)
        else:
            activations = config.n_layer * layer_activation_bytes(config, tokens, precision)
            activations += tokens * config.n_embd * (RESIDUAL_BYTES + width)  # ln_f's and the head's input
            logit_tokens = tokens
        # The logits at the activation width and their fp32 log-probabilities (which become the gradient).
        logits = logit_tokens * config.vocab_size * (width + 4)
        # Host memory: on CUDA the snapshot is not on the device.
        snapshot = 4 * parameters + optimizer if self.checkpoint_snapshot and self.device != "cuda" else 0
        # Gradients exist during a forward pass only while they accumulate over micro-batches.
        accumulating = gradients if grad_accum_steps > 1 else 0
        forward_peak = weights + optimizer + activations + logits + accumulating
        step_peak = weights + gradients + optimizer
        in_use = max(forward_peak, step_peak, 4 * parameters + optimizer + snapshot) + WORKSPACE_BYTES
        host_allocator = int(in_use * HOST_ALLOCATOR_SHARE) if self.device == "cpu" else 0
        return {
            "weights": weights,
            "gradients": gradients,
            "optimizer": optimizer,
            "activations": activations,
            "logits": logits,
            "checkpoint_snapshot": snapshot,
            "workspace": WORKSPACE_BYTES,
            "host_allocator": host_allocator,
            "total": in_use + host_allocator,
        }

    def total(self, batch_size: int, grad_accum_steps: int = 1) -> int:
        return self.estimate(batch_size, grad_accum_steps)["total"]


def _status_bytes(field: str) -> int | None:
    """A size from /proc/self/status (Linux: `VmRSS`, `VmHWM`), in bytes; None elsewhere."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in _STATUS.read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024  # kB
    return None


def resident_bytes() -> int | None:
    """The process's resident set now (Linux), else None."""
    return _status_bytes("VmRSS")


def reset_peak_memory(device: str) -> bool:
    """Start a new peak: CUDA's allocator statistics; on Linux the process's peak resident set (writing
    5 to clear_refs sets it to the resident set now). False where the peak cannot be reset."""
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        return True
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:  # not Linux, or not allowed: the peak stays the process's life
        return False


def peak_memory_bytes(device: str) -> int:
    """CUDA: the caching allocator's peak since the last reset. CPU: the process's peak resident set since
    the last reset on Linux (VmHWM), else over the process's whole life."""
    if device == "cuda":
        return int(torch.cuda.max_memory_allocated())
    high_water = _status_bytes("VmHWM")
    if high_water is not None:
        return high_water
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


@dataclass
class TrainingMemory:
    """The training's own peak: `before_model()` where the run starts building, `start()` when the first
    step is about to run, `peak()` at the end (None where it cannot be measured; `source` says why)."""

    device: str
    baseline: int | None  # bytes in use before the model existed (resident on CPU, allocated on CUDA)
    resettable: bool = False
    budget: int | None = None  # bytes a step could use when training started

    @classmethod
    def before_model(cls, device: str) -> TrainingMemory:
        if device == "cuda":
            return cls(device, int(torch.cuda.memory_allocated()))
        if device != "cpu":
            return cls(device, None)  # mps: no peak statistic to read
        # The optimizer's construction imports the compiler stack (about 70 MB of modules): imported
        # now, so the baseline holds it and the training's figure does not.
        importlib.import_module("torch._dynamo")

        host_memory.release_free_heap()  # freed pages are not the baseline's, nor reusable unseen
        return cls(device, resident_bytes())

    def held(self) -> int:
        """Bytes the run holds now beyond the baseline (its weights, once built); 0 where unknown."""
        if self.baseline is None:
            return 0
        if self.device == "cuda":
            return max(0, int(torch.cuda.memory_allocated()) - self.baseline)
        return max(0, (resident_bytes() or self.baseline) - self.baseline)

    def start(self, budget: int | None = None) -> None:
        """Training starts now; `budget`: the bytes a step may use, measured now (for the advice after
        running out of memory)."""
        if self.device == "cpu":
            host_memory.release_free_heap()  # what building the run freed is not counted as in use
        self.resettable = self.baseline is not None and reset_peak_memory(self.device)
        self.budget = budget

    def peak(self) -> int | None:
        if not self.resettable or self.baseline is None:
            return None
        return max(0, peak_memory_bytes(self.device) - self.baseline)

    @property
    def source(self) -> str:
        if self.device == "cuda":
            return "cuda max_memory_allocated since training started, less what the model found allocated"
        if self.resettable:
            return "VmHWM (resident high-water mark) since training started, less VmRSS before the model"
        return (
            f"unavailable on {self.device} here: the resident high-water mark cannot be reset "
            "(no writable /proc/self/clear_refs), so only the process's lifetime peak is known"
            if self.device == "cpu"
            else f"unavailable on {self.device}: the backend keeps no peak statistic"
        )


def is_out_of_memory(error: BaseException) -> bool:
    """A CUDA out-of-memory error, or the CPU allocator's refusal."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and "can't allocate memory" in str(error)
