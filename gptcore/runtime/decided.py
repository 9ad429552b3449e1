"""The runtime a run was decided to run with: device, precision, batch, threads and why each, resolved
from a `RuntimeConfig` once (`gptcore.runtime.device.resolve_runtime`) and carried as this record from
the pipeline's device stage to the trainer, its start-up record and MLflow."""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

from gptcore.runtime.config import ConcreteDevice, ConcretePrecision
from gptcore.tools.records import JSONObject

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Runtime:
    """A resolved runtime: what the trainer runs with, and what the startup line reports."""

    device: ConcreteDevice
    precision: ConcretePrecision
    batch_size: int
    grad_accum_steps: int
    batch_size_source: str  # "configured", or how `auto` was decided: "probed" (CUDA) or "estimated"
    effective_batch_target: int | None  # runtime.effective_batch_size: the accumulation follows it
    workers: int
    fused_adamw: bool
    tf32_enabled: bool
    tensor_cores_enabled: bool
    pin_memory: bool
    compile: bool
    compile_source: str  # "requested", or why `auto` chose it
    activation_checkpointing: bool
    cpu_threads: int
    precision_source: str  # "requested" or "profile default" or why auto chose it
    # An explicit precision that trains slower than fp32 on this device, measured (precision_speed).
    precision_warning: str | None
    host_allocator: str  # glibc malloc settings this process runs with (gptcore.runtime.malloc)

    @property
    def dtype(self) -> torch.dtype:
        from gptcore.runtime.precision_speed import DTYPES

        return DTYPES[self.precision]

    @property
    def uses_grad_scaler(self) -> bool:
        return self.precision == "fp16"

    def autocast(self) -> contextlib.AbstractContextManager:
        """Mixed precision for the forward pass; fp32 runs without autocast at all."""
        if self.precision == "fp32":
            return contextlib.nullcontext()
        import torch

        return torch.autocast(device_type=self.device, dtype=self.dtype)

    def to_dict(self) -> JSONObject:
        return asdict(self)

    def in_this_process(self) -> Runtime:
        """The same decision, with the facts of the process that runs it (a rank under torchrun has
        its own threads; the heap's settings are each process's)."""
        import torch

        from gptcore.runtime import malloc

        return replace(self, cpu_threads=torch.get_num_threads(), host_allocator=malloc.describe())
