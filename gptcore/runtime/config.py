"""What a run asks of the machine: device, precision, batch, processes. `gptcore.runtime.device` resolves
`auto` and the unset fields once, for the device the run lands on."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from gptcore.tools.strict import Strict

Device = Literal["auto", "cpu", "cuda", "mps"]
ConcreteDevice = Literal["cpu", "cuda", "mps"]
Precision = Literal["auto", "fp32", "bf16", "fp16"]
ConcretePrecision = Literal["fp32", "bf16", "fp16"]
PositiveInt = Annotated[int, Field(ge=1)]


class DeviceDefaults(Strict):
    """What a model runs with on one kind of device unless the user says otherwise."""

    batch_size: int = Field(ge=1, le=1 << 16, description="sequences per rank and micro-step")
    grad_accum_steps: int = Field(default=1, ge=1, le=1 << 16, description="micro-steps per optimizer step")
    precision: ConcretePrecision = Field(default="fp32", description="the precision `auto` starts from")
    workers: int = Field(default=0, ge=0, le=64, description="batch-loading worker processes")


class RuntimeConfig(Strict):
    """What the user asks for; `gptcore.runtime.device` resolves `auto` and the unset fields per device."""

    device: Device = Field(
        default="auto",
        description="auto: CUDA, then Apple's MPS, then the CPU; a device named is that or an error",
    )
    precision: Precision = Field(
        default="auto",
        description="auto: the device defaults' precision, never a 16-bit one that trains slower than "
        "fp32 here",
    )
    batch_size: PositiveInt | Literal["auto"] | None = Field(
        default=None,
        description="per rank and micro-step; auto: the largest that fits (gptcore.runtime.batch_size)",
    )
    grad_accum_steps: int | None = Field(default=None, ge=1, description="micro-steps per optimizer step")
    effective_batch_size: int | None = Field(
        default=None, ge=1, description="samples per optimizer step; sets the accumulation for the batch"
    )
    workers: int | None = Field(default=None, ge=0, description="batch-loading worker processes")
    nproc: int | Literal["auto"] = Field(
        default=1, description="data-parallel processes (torchrun); auto: one per GPU, else one"
    )
    compile: bool | Literal["auto"] = Field(
        default="auto",
        description="torch.compile the model (needs a C compiler); auto: on for CUDA (a failed start-up "
        "probe trains eager and says why), off on the CPU, where it did not pay",
    )
    activation_checkpointing: bool = Field(
        default=False,
        description="recompute each transformer block in the backward pass: less memory, more compute",
    )
    cpu: DeviceDefaults | None = Field(
        default=None, description="the CPU's defaults, in place of the profile's"
    )
    gpu: DeviceDefaults | None = Field(
        default=None, description="an accelerator's (CUDA, MPS) defaults, in place of the profile's"
    )

    @field_validator("compile", mode="before")
    @classmethod
    def _compile_choice(cls, value: Any) -> Any:
        if value is True or value is False or value == "auto":
            return value
        raise ValueError("expected true, false or auto")

    @model_validator(mode="after")
    def _effective_batch_divides(self) -> RuntimeConfig:
        batch, effective = self.batch_size, self.effective_batch_size
        if isinstance(batch, int) and effective is not None and effective % batch:
            raise ValueError(
                f"runtime.effective_batch_size {effective} is not a multiple of runtime.batch_size {batch}"
            )
        return self
