"""The device check: never cached, because it is cheap and the machine may have changed since the last
run. What it decides (the device, the precision, the batch) is what the training stages train with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gptcore.runtime.decided import Runtime
from gptcore.runtime.device import DeviceReport
from tasks.params.jobs import TrainingStart
from tasks.results import StageResult
from tasks.stage import Stage


class DeviceResult(StageResult):
    device: DeviceReport  # the machine's facts and its precision probe
    runtime: Runtime  # the decided runtime: what the training stages train with


@dataclass(frozen=True, kw_only=True)
class Device(Stage[DeviceResult]):
    """What the training stages will run on: the device report (with each 16-bit precision's measured
    speed against fp32, which `precision: auto` decided by) and the resolved runtime."""

    result_type = DeviceResult
    cached = False
    name: str = "device"
    start: TrainingStart  # the model trained: its profile's batch and precision defaults

    def key(self) -> tuple[Any, ...]:
        return ()  # never cached

    def compute(self, fingerprint: str | None) -> DeviceResult:
        from gptcore.runtime.device import device_report, resolve_runtime

        runtime = resolve_runtime(self.params.runtime, self.start.device_defaults(self.params))
        report = device_report(runtime.device)
        return DeviceResult(
            device=report,
            runtime=runtime,
            figures={
                "device": runtime.device,
                "precision": runtime.precision,
                "batch_size": runtime.batch_size,  # with `auto`, the profile's until the smoke stage decides
                "batch_size_source": runtime.batch_size_source,
                "grad_accum_steps": runtime.grad_accum_steps,
                "cuda_available": report.cuda_available,
                "gpu_name": report.gpu_name,
                **(report.precision_speeds.figures() if report.precision_speeds else {}),
            },
        )
