"""Device and precision resolution: every runtime decision made explicitly, then reported.

`resolve_runtime` turns what the user asked for (`RuntimeConfig`, with `auto`s and unset fields) into a
concrete `Runtime`, taking the profile's CPU or GPU defaults for whatever was left unset. Asking for
something this machine cannot do is a `DeviceError`, never a silent fallback. `device_report` is the
environment check the CLI's `gptpipe device` and the pipeline's device stage print.
"""

from __future__ import annotations

import contextlib
import platform
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace
from functools import cache
from typing import Any, Protocol

import torch

from gptcore.errors import DeviceError, first_line
from gptcore.runtime import malloc as host_memory
from gptcore.runtime.config import ConcreteDevice, ConcretePrecision, DeviceDefaults, RuntimeConfig
from gptcore.runtime.decided import Runtime
from gptcore.runtime.precision_speed import (
    PrecisionSpeeds,
    measure_precision_speeds,
    slower_than_fp32_warning,
)
from gptcore.tools.records import JSONObject


class DefaultsTable(Protocol):
    """Defaults per kind of device, as a model profile holds them."""

    @property
    def cpu(self) -> DeviceDefaults: ...

    @property
    def gpu(self) -> DeviceDefaults: ...


DefaultsSource = Callable[[str], DeviceDefaults] | DefaultsTable


def _defaults(source: DefaultsSource, request: RuntimeConfig, device: str) -> DeviceDefaults:
    """An accelerator (CUDA, MPS) takes the `gpu` defaults, the CPU the `cpu` ones."""
    if callable(source):
        return source(device)
    override = request.gpu if device != "cpu" else request.cpu
    return override or (source.gpu if device != "cpu" else source.cpu)


def mps_available() -> bool:
    """Apple's Metal backend: built into this torch and usable on this machine (macOS 12.3+, Apple GPU)."""
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def resolve_device(requested: str) -> ConcreteDevice:
    """`auto` takes CUDA, then MPS, then the CPU; a device asked for by name is that device or an error."""
    if requested == "cpu":
        return "cpu"
    if requested in ("auto", "cuda") and torch.cuda.is_available():
        return "cuda"
    if requested == "cuda":
        raise DeviceError(
            f"--device cuda: CUDA is not available (torch {torch.__version__}, "
            f"{'a CPU-only build' if torch.version.cuda is None else 'no GPU visible or driver missing'}); "
            "run with --device cpu or auto, or install a CUDA build of torch on a machine with a GPU"
        )
    if requested in ("auto", "mps") and mps_available():
        return "mps"
    if requested == "mps":
        raise DeviceError(
            f"--device mps: Apple's Metal (MPS) backend is not available here (torch {torch.__version__} "
            f"on {platform.system()}; it needs macOS 12.3+ on Apple silicon or an AMD GPU); "
            "run with --device cpu or auto"
        )
    return "cpu"


def _bf16_supported(device: str) -> bool:
    if device == "cuda":
        return torch.cuda.is_bf16_supported()
    if device == "mps":
        return bool(torch.backends.mps.is_macos_or_newer(14, 0))  # MPS has bfloat16 from macOS 14
    return True  # CPU autocast runs bf16 everywhere (fast where the CPU has AVX512-BF16 or AMX)


def resolve_precision(
    requested: str,
    default: ConcretePrecision,
    device: str,
    speeds: PrecisionSpeeds | None = None,
) -> tuple[ConcretePrecision, str]:
    """(precision, why). An explicit bf16 on a GPU without it is an error; a profile default of bf16
    there falls back to fp16 with gradient scaling on CUDA, to fp32 on MPS, and says so in
    `precision_source`. `auto` never takes a 16-bit default that trains slower than fp32 on this device
    (`speeds`, the device's matmul probe; measured here when not given)."""
    if requested != "auto":
        if requested == "bf16" and not _bf16_supported(device):
            gpu = torch.cuda.get_device_name() if device == "cuda" else "MPS before macOS 14"
            raise DeviceError(
                f"--precision bf16: this GPU ({gpu}) does not support bfloat16; "
                "use --precision fp16 (mixed precision with gradient scaling) or --precision fp32"
            )
        return requested, "requested"  # type: ignore[return-value]
    precision, source = default, "auto: profile default"
    if default == "bf16" and not _bf16_supported(device):
        if device == "mps":  # no gradient scaling is tried on MPS: its fp16 would need it
            return "fp32", "auto: profile default bf16 needs macOS 14 on MPS, fp32"
        precision = "fp16"
        source = "auto: profile default bf16 is unsupported on this GPU, fp16 with gradient scaling"
    if precision == "fp32":
        return precision, source
    speed = (speeds or measure_precision_speeds(device)).of(precision)
    if speed is not None and speed.trains_slower:
        return "fp32", (
            f"auto: profile default {precision} trains at {speed.train_speedup:.2f}x fp32's speed on this "
            f"{device} (measured), fp32"
        )
    return precision, source


@cache
def fused_adamw_supported(device: str) -> bool:
    """Whether the installed build has fused AdamW kernels for this device. Asks torch's own table of
    fused-kernel devices (the one AdamW checks) rather than running a step, which would import the
    compiler stack (over a second) in every command; on builds without that table, tries one step."""
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        return device in _get_fused_kernels_supported_devices()
    except ImportError:
        return _fused_adamw_step_runs(device)


def _fused_adamw_step_runs(device: str) -> bool:
    try:
        parameter = torch.zeros(4, device=device, requires_grad=True)
        parameter.grad = torch.ones_like(parameter)
        torch.optim.AdamW([parameter], lr=1e-3, fused=True).step()
        return True
    except (RuntimeError, ValueError, TypeError):
        return False


def resolve_compile(requested: bool | str, device: str) -> tuple[bool, str]:
    """Whether to compile, and why: as asked, or `auto`: on for CUDA, where fused kernels pay (the
    trainer's start-up probe falls back to eager when the compiler fails), off elsewhere (on this
    project's CPUs compiling ran at 0.95x eager after 44 s of compilation: docs/benchmarks.md)."""
    if requested != "auto":
        return bool(requested), "requested"
    if device == "cuda":
        return True, "auto: on for CUDA"
    return False, f"auto: off on {device}, where compiling does not pay"


def resolve_runtime(
    request: RuntimeConfig, defaults_for: DefaultsSource, speeds: PrecisionSpeeds | None = None
) -> Runtime:
    """The runtime `request` resolves to on this machine; `speeds`: the device stage's precision probe,
    so a training decides `auto` as the stage did (measured here when not given and needed)."""
    device = resolve_device(request.device)
    defaults = _defaults(defaults_for, request, device)
    precision, source = resolve_precision(request.precision, defaults.precision, device, speeds)
    warning = None
    if request.precision != "auto" and precision != "fp32":  # asked for by name: kept, warned of
        warning = slower_than_fp32_warning(precision, speeds or measure_precision_speeds(device))
    compile_on, compile_source = resolve_compile(request.compile, device)
    tf32 = device == "cuda"
    return Runtime(
        device=device,
        precision=precision,
        # `auto` holds the profile's batch until the trainer decides it (gptcore.runtime.batch_size).
        batch_size=request.batch_size if isinstance(request.batch_size, int) else defaults.batch_size,
        grad_accum_steps=request.grad_accum_steps or defaults.grad_accum_steps,
        batch_size_source="auto" if request.batch_size == "auto" else "configured",
        effective_batch_target=request.effective_batch_size,
        workers=defaults.workers if request.workers is None else request.workers,
        fused_adamw=fused_adamw_supported(device),
        tf32_enabled=tf32,
        tensor_cores_enabled=device == "cuda" and (tf32 or precision != "fp32"),
        pin_memory=device == "cuda",
        compile=compile_on,
        compile_source=compile_source,
        activation_checkpointing=request.activation_checkpointing,
        cpu_threads=torch.get_num_threads(),
        precision_source=source,
        precision_warning=warning,
        host_allocator=host_memory.describe(),
    )


def apply_runtime(runtime: Runtime) -> Runtime:
    """Process-wide switches the runtime implies: TF32 matmuls and convolutions on CUDA; a heap that
    hands large arrays back when activations are recomputed on CPU. Returns the runtime as applied."""
    if runtime.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = runtime.tf32_enabled
        torch.backends.cudnn.allow_tf32 = runtime.tf32_enabled
        torch.set_float32_matmul_precision("high" if runtime.tf32_enabled else "highest")
    if runtime.device == "cpu" and runtime.activation_checkpointing:
        return replace(runtime, host_allocator=host_memory.favour_memory())
    return runtime


@contextlib.contextmanager
def cuda_errors_as_device_errors() -> Iterator[None]:
    """A CUDA initialisation failure (driver, busy GPU) comes out as one line, not a traceback."""
    try:
        yield
    except RuntimeError as error:
        if "CUDA" not in str(error) or "out of memory" in str(error):
            raise
        raise DeviceError(f"CUDA failed to start: {first_line(error)}") from None


def processor_name() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


@dataclass(frozen=True)
class DeviceReport:
    """The environment as facts: torch, CUDA, the device a run would take, what it supports, and what
    each 16-bit precision is worth there (the matmul probe's ratios to fp32), when measured."""

    torch_version: str
    torch_cuda_version: str | None
    cuda_available: bool
    cuda_device_count: int
    mps_available: bool
    device: ConcreteDevice
    processor: str
    cpu_threads: int
    bf16_supported: bool
    fused_adamw_supported: bool
    fp16_supported: bool = True
    tf32_supported: bool = False  # Ampere and later GPUs have TF32 tensor cores
    gpu_name: str | None = None
    gpu_memory_bytes: int | None = None
    gpu_compute_capability: str | None = None
    precision_speeds: PrecisionSpeeds | None = None

    def to_dict(self) -> JSONObject:
        """As `gptpipe device --json` prints it: the facts, and the probe's figures flat beside its record
        (`bf16_train_speedup`, ..., `bf16_emulated`)."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "precision_speeds"}
        if self.precision_speeds is not None:
            speeds = self.precision_speeds
            values["precision_speeds"] = speeds.to_dict()
            values.update(speeds.figures())
            values.update({f"{s.precision}_emulated": s.emulated for s in speeds.speeds})
        return values


def device_report(device: str = "auto", precision_speeds: bool = True) -> DeviceReport:
    """The environment of a run on `device` (`auto` resolved here), with the precision probe's figures when
    `precision_speeds`."""
    resolved = resolve_device(device)
    cuda = torch.cuda.is_available()
    gpu: dict[str, Any] = {}
    if resolved == "cuda":
        properties = torch.cuda.get_device_properties(0)
        gpu = {
            "gpu_name": properties.name,
            "gpu_memory_bytes": int(properties.total_memory),
            "gpu_compute_capability": f"{properties.major}.{properties.minor}",
            "tf32_supported": properties.major >= 8,
        }
    return DeviceReport(
        torch_version=torch.__version__,
        torch_cuda_version=torch.version.cuda,
        cuda_available=cuda,
        cuda_device_count=torch.cuda.device_count() if cuda else 0,
        mps_available=mps_available(),
        device=resolved,
        processor=processor_name(),
        cpu_threads=torch.get_num_threads(),
        bf16_supported=_bf16_supported(resolved),
        fused_adamw_supported=fused_adamw_supported(resolved),
        precision_speeds=measure_precision_speeds(resolved) if precision_speeds else None,
        **gpu,
    )
