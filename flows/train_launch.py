"""`gptpipe train` on several processes: relaunch the same command under torchrun, one process per device.

The parent `gptpipe train --nproc N` starts torchrun through `gptcore.launch` with its own arguments
(the launch flags left out), streams the ranks' output to its stdout and exits with the first failing
rank's exit code. Each rank runs `gptpipe train` again; seeing torchrun's environment, it joins the
process group instead of launching. Torch is imported inside the functions only.
"""

from __future__ import annotations

import sys
from typing import Any

from gptcore.errors import ConfigError

# Options of `gptpipe train` that say how to launch, not what to train: the ranks do not get them.
LAUNCH_OPTIONS = ("nproc", "nnodes", "node_rank", "rdzv_endpoint", "rdzv_backend", "rdzv_id")


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
    from gptcore.launch import LaunchSpec, resolve_nproc, under_torchrun

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


def child_arguments(ctx: Any) -> list[str]:
    """This command's own arguments, rebuilt from what was parsed, without the launch options."""
    arguments = [ctx.info_name]
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if param.name in LAUNCH_OPTIONS or value is None or getattr(param, "opts", None) is None:
            continue
        flag = param.opts[0]
        if getattr(param, "is_flag", False):
            arguments += [flag] if value else []
        elif getattr(param, "multiple", False):
            for item in value:
                arguments += [flag, str(item)]
        else:
            arguments += [flag, str(value)]
    return arguments


def relaunch_under_torchrun(spec: Any, ctx: Any) -> int:
    """Run this command once per rank under torchrun; lines stream to stdout; the first failing rank's
    exit code comes back."""
    from gptcore.launch import launch_environment, run_training_subprocess, torchrun_command

    command = torchrun_command(spec, child_arguments(ctx))
    print(f"launching {spec.nproc_per_node} process(es) per node under torchrun", file=sys.stderr, flush=True)

    def echo(line: str) -> None:
        # JSON lines (rank 0's records) on stdout, as in process; everything else (logs, errors) on stderr.
        print(line, file=sys.stdout if line.startswith("{") else sys.stderr, flush=True)

    return run_training_subprocess(command, echo, env=launch_environment(spec))
