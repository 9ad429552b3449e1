"""The device check: never cached, because it is cheap and the machine may have changed since the last run."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.params.schema import PipelineParams
from tasks.results import DeviceResult


@task(name="device", cache_policy=NO_CACHE, persist_result=False)
def device_task(params: PipelineParams) -> DeviceResult:
    """What the training stages will run on: the device report (with each 16-bit precision's measured
    speed against fp32, which `precision: auto` decided by) and the resolved runtime."""
    from gptcore.runtime.device import device_report, resolve_runtime

    runtime = resolve_runtime(params.runtime, params.defaults_for)
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
