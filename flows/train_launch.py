"""`gptpipe train` on several processes: the torchrun topology its flags ask for.

The training itself is launched by `gptcore.train.multiprocess.launch_job` (see
`flows.cli.train.train_launched`),
the same way the pipeline's full stage launches it. Torch is imported inside the functions only.
"""

from __future__ import annotations

from typing import Any

from gptcore.errors import ConfigError


def nproc_value(raw: str | None) -> int | str | None:
    """`--nproc`: a positive integer or `auto`, as `runtime.nproc` holds it."""
    if raw is None or raw == "auto":
        return raw
    if raw.isdigit() and int(raw) >= 1:
        return int(raw)
    raise ConfigError(f"--nproc {raw!r}: expected a positive integer or auto")


def launch_spec(params: Any, launch: dict[str, Any]) -> Any | None:
    """The torchrun topology when this command must launch ranks, None when it trains in process
    (one process asked for, or already a rank under torchrun)."""
    from gptcore.distributed.torchrun import LaunchSpec, resolve_nproc, under_torchrun

    if under_torchrun():
        return None
    nproc = resolve_nproc(params.runtime.nproc, params.runtime.device)  # torch imported only for auto
    spec = LaunchSpec(
        nproc_per_node=nproc,
        nnodes=launch.get("nnodes") or 1,
        node_rank=launch.get("node_rank") or 0,
        rdzv_endpoint=launch.get("rdzv_endpoint"),
        rdzv_backend=launch.get("rdzv_backend") or "c10d",
        rdzv_id=launch.get("rdzv_id"),
    )
    return spec if spec.needs_torchrun else None
