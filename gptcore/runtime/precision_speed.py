"""What each precision is worth on this device, measured: a short matmul probe against fp32.

A 16-bit type is only faster where the hardware computes in it. CPUs without AVX512-BF16 or AMX
convert bf16 to fp32 and back around every multiply (one of this project's machines trained iteration
1's model 45x slower in bf16 than in fp32), while a memory-bound matrix-vector product still gains from
moving half the bytes. So two shapes are timed per precision: a training-shaped, compute-bound product
(what training and prefill run) and a decode-shaped, memory-bound one (what generation runs), each as a
ratio of fp32's speed on the same device in the same process. The whole probe stays well under a
second even where a precision is emulated at a fraction of a GFLOP/s: a shape whose first run already
exceeds its time budget is measured by that run alone.

The ratios decide `runtime.precision: auto` (never a precision that trains slower than fp32), warn an
explicit request that will, and label the quantize table's rows; the device stage records them.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

import torch

from gptcore.tools.records import JSONObject

Shape = tuple[int, int, int]  # (m, k, n): m rows of k features through a linear layer to n

# Per device: a compute-bound training shape and a memory-bound decode shape (one row through a weight
# larger than a CPU's L2 cache). A GPU needs far larger products before launch overhead stops dominating.
SHAPES: dict[str, tuple[Shape, Shape]] = {
    "cpu": ((256, 256, 256), (1, 2048, 2048)),
    "cuda": ((4096, 4096, 4096), (1, 8192, 8192)),
    "mps": ((2048, 2048, 2048), (1, 8192, 8192)),
}
SECONDS = 0.02  # per shape and precision, after one untimed run
PRECISIONS = ("bf16", "fp16")  # the 16-bit types measured against fp32
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# The CPU instructions that compute a 16-bit type natively (Linux /proc/cpuinfo flags).
NATIVE_FLAGS = {"bf16": ("avx512_bf16", "amx_bf16"), "fp16": ("avx512_fp16", "amx_fp16")}


@dataclass(frozen=True)
class PrecisionSpeed:
    """One 16-bit precision's speed on a device as a multiple of fp32's (above 1: faster)."""

    precision: str
    device: str
    train_speedup: float  # a training-shaped (compute-bound) matmul: training and prefill
    decode_speedup: float  # a decode-shaped (memory-bound) matrix-vector product: generation
    native: bool | None  # the CPU has instructions for it (None: not a CPU, or its flags unknown)

    @property
    def trains_slower(self) -> bool:
        """Training in this precision would be slower than in fp32 here."""
        return self.train_speedup < 1.0

    @property
    def emulated(self) -> bool:
        """A CPU computes it by converting to fp32 (no native instructions, or slower than fp32)."""
        return self.device == "cpu" and (self.native is False or self.trains_slower)

    def describe(self) -> str:
        """`bf16 on cpu: training-shaped matmuls 0.16x fp32, decode-shaped 1.52x (emulated: ...)`."""
        how = ""
        if self.emulated:
            flags = " or ".join(NATIVE_FLAGS.get(self.precision, ()))
            how = f" (emulated: this CPU has no {flags})" if self.native is False else " (emulated)"
        return (
            f"{self.precision} on {self.device}: training-shaped matmuls {self.train_speedup:.2f}x fp32's "
            f"speed, decode-shaped {self.decode_speedup:.2f}x{how}"
        )


@dataclass(frozen=True)
class PrecisionSpeeds:
    """The probe's result for a device: each 16-bit precision against fp32."""

    device: str
    speeds: tuple[PrecisionSpeed, ...]

    def of(self, precision: str) -> PrecisionSpeed | None:
        """The speed of `precision` (None for fp32, the reference, or one not measured)."""
        return next((speed for speed in self.speeds if speed.precision == precision), None)

    def figures(self) -> dict[str, float]:
        """The ratios under their record names: `bf16_train_speedup`, `bf16_decode_speedup`, ..."""
        figures: dict[str, float] = {}
        for speed in self.speeds:
            figures[f"{speed.precision}_train_speedup"] = round(speed.train_speedup, 4)
            figures[f"{speed.precision}_decode_speedup"] = round(speed.decode_speedup, 4)
        return figures

    def to_dict(self) -> JSONObject:
        return {"device": self.device, "speeds": [asdict(speed) for speed in self.speeds]}

    @classmethod
    def from_dict(cls, data: JSONObject) -> PrecisionSpeeds:
        return cls(data["device"], tuple(PrecisionSpeed(**speed) for speed in data["speeds"]))


def slower_than_fp32_warning(precision: str, speeds: PrecisionSpeeds) -> str | None:
    """The one warning line for an explicit request of a precision that trains slower than fp32 here."""
    speed = speeds.of(precision)
    if speed is None or not speed.trains_slower:
        return None
    return (
        f"--precision {precision}: {speed.describe()}; training will be slower than in fp32 "
        "(runtime.precision auto would take fp32 here)"
    )


@cache
def measure_precision_speeds(device: str) -> PrecisionSpeeds:
    """Each 16-bit precision's training- and decode-shaped matmul speed against fp32's on `device`,
    measured once per process (about 0.1-0.3 s on a CPU, wherever a precision is emulated)."""
    train_shape, decode_shape = SHAPES.get(device, SHAPES["cpu"])
    fp32 = (_flops(device, "fp32", train_shape), _flops(device, "fp32", decode_shape))
    speeds = tuple(
        PrecisionSpeed(
            precision,
            device,
            _flops(device, precision, train_shape) / fp32[0],
            _flops(device, precision, decode_shape) / fp32[1],
            cpu_native(precision) if device == "cpu" else None,
        )
        for precision in PRECISIONS
    )
    return PrecisionSpeeds(device, speeds)


def _flops(device: str, precision: str, shape: Shape, seconds: float = SECONDS) -> float:
    """The best FLOP/s of an (m, k) input through an (n, k) weight, as the model's linear layers run,
    over about `seconds` after one untimed run, or that run alone where it already took longer than
    `seconds` (a precision this slow needs no second sample)."""
    m, k, n = shape
    dtype = DTYPES[precision]
    a = torch.randn(m, k, device=device).to(dtype)
    b = torch.randn(n, k, device=device).to(dtype)
    best = _timed(device, a, b)
    deadline, timed = time.perf_counter() + seconds, 0
    while best < seconds and (timed < 3 or time.perf_counter() < deadline):
        best, timed = min(best, _timed(device, a, b)), timed + 1
    return 2 * m * k * n / max(best, 1e-9)


def _timed(device: str, a: torch.Tensor, b: torch.Tensor) -> float:
    synchronize(device)
    start = time.perf_counter()
    torch.nn.functional.linear(a, b)
    synchronize(device)
    return time.perf_counter() - start


def synchronize(device: str) -> None:
    """Wait for the device's queued work, so a clock around it measures the work itself."""
    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "mps":
        torch.mps.synchronize()


def cpu_native(precision: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> bool | None:
    """Whether the CPU's flags name an instruction set computing `precision` (None: flags unknown)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    lines = [line for line in text.splitlines() if line.startswith("flags")]
    if not lines:
        return None
    flags = lines[0].split(":", 1)[1].split()
    return any(flag in flags for flag in NATIVE_FLAGS[precision])
