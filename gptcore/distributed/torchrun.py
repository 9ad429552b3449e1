"""Launching training under torchrun, as a watched subprocess.

`torchrun_command` builds the command: `python -m gptcore.distributed.torchrun <torchrun flags>
--no-python python -m <rank module> <its arguments>` (the training's: `gptcore.train.multiprocess
JOB.json`), where `python` is GPTPIPE_PYTHON's command where set (`nice -n 10 python`, `numactl
--interleave=all python`: the launcher and every rank run under it), else this interpreter. This
module run as a module is torchrun itself (`torch.distributed.run`) with two differences: it exits with
the exit code of the first rank that failed (torchrun exits 1 whatever the rank did; a rank killed by
a signal gives 128 + the signal, as shells do), and it stops its ranks when the process that launched
it dies. `gptcore.tools.processes` runs it and stops torchrun and every rank together.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from gptcore.errors import ConfigError
from gptcore.tools.processes import LAUNCHER_PID_VARIABLE, die_with_parent
from gptcore.tools.programs import configured_program

RDZV_BACKENDS = ("c10d", "static")
PYTHON_VARIABLE = "GPTPIPE_PYTHON"  # the command the launcher and its ranks run Python modules with


@dataclass(frozen=True)
class LaunchSpec:
    """torchrun's topology flags. One node: a standalone rendezvous on a free local port. Several: every
    node runs the same command with its own `node_rank`, all naming one `rdzv_endpoint` (host:port)."""

    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_backend: str = "c10d"
    rdzv_id: str | None = None

    def __post_init__(self) -> None:
        if self.nproc_per_node < 1:
            raise ConfigError(f"--nproc {self.nproc_per_node}: must be at least 1 (or auto)")
        if self.nnodes < 1:
            raise ConfigError(f"--nnodes {self.nnodes}: must be at least 1")
        if not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(f"--node-rank {self.node_rank}: must be in 0..{self.nnodes - 1}")
        if self.rdzv_backend not in RDZV_BACKENDS:
            raise ConfigError(
                f"--rdzv-backend {self.rdzv_backend!r}: expected one of {', '.join(RDZV_BACKENDS)}"
            )
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ConfigError(
                f"--nnodes {self.nnodes}: needs --rdzv-endpoint HOST:PORT, the address every node reaches "
                "(the first node's, for example)"
            )
        if self.rdzv_endpoint and ":" not in self.rdzv_endpoint:
            raise ConfigError(f"--rdzv-endpoint {self.rdzv_endpoint!r}: expected HOST:PORT")

    @property
    def needs_torchrun(self) -> bool:
        return self.nproc_per_node > 1 or self.nnodes > 1

    def torchrun_flags(self) -> list[str]:
        flags = ["--nproc-per-node", str(self.nproc_per_node)]
        if self.nnodes == 1 and not self.rdzv_endpoint:
            return [*flags, "--standalone"]
        flags += ["--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank)]
        flags += ["--rdzv-backend", self.rdzv_backend, "--rdzv-endpoint", str(self.rdzv_endpoint)]
        return [*flags, "--rdzv-id", self.rdzv_id] if self.rdzv_id else flags


def under_torchrun(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process was started by torchrun (or another launcher setting the same variables)."""
    env = os.environ if env is None else env
    return "WORLD_SIZE" in env and "RANK" in env


def resolve_nproc(nproc: int | Literal["auto"] | str, device: str = "auto") -> int:
    """`auto`: one process per visible GPU when training on CUDA (`device` auto or cuda), one on CPU (a
    CPU process already uses every core through its threads)."""
    if nproc != "auto":
        try:
            value = int(nproc)
        except ValueError:
            raise ConfigError(f"--nproc {nproc!r}: expected a positive integer or auto") from None
        if value < 1:
            raise ConfigError(f"--nproc {value}: must be at least 1 (or auto)")
        return value
    import torch

    if device == "cpu" or not torch.cuda.is_available():
        return 1
    return max(1, torch.cuda.device_count())


def worker_threads(nproc_per_node: int) -> int:
    """CPU threads per rank: the cores this process may use, shared out (torchrun would set 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // nproc_per_node)


def python_program() -> list[str]:
    """The command that runs the launcher's and its ranks' Python modules: GPTPIPE_PYTHON's, split as a
    shell splits it, else this interpreter."""
    return configured_program(PYTHON_VARIABLE) or [sys.executable]


def torchrun_command(
    spec: LaunchSpec, module: str, train_args: Sequence[str], python: Sequence[str] | None = None
) -> list[str]:
    """The command that runs `python -m <module> <train_args>` once per rank under torchrun, `python`
    (python_program's by default) for the launcher and the ranks alike (torchrun's --no-python: it runs
    the rank's command as given); the caller names its rank module (`gptcore.train.multiprocess` names
    itself), so this room names none above it."""
    program = list(python or python_program())
    launcher = [*program, "-m", "gptcore.distributed.torchrun", *spec.torchrun_flags()]
    return [*launcher, "--no-python", *program, "-m", module, *train_args]


def launch_environment(spec: LaunchSpec, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.setdefault("OMP_NUM_THREADS", str(worker_threads(spec.nproc_per_node)))
    env["PYTHONUNBUFFERED"] = "1"  # lines reach the watcher as they are written
    env[LAUNCHER_PID_VARIABLE] = str(os.getpid())
    return env


# --- the torchrun entry point (`python -m gptcore.distributed.torchrun ...`) --------------------------------


def exit_code_of(failure_exitcode: int) -> int:
    """A rank's exit code as a shell reports it: a signal N becomes 128 + N."""
    return 128 - failure_exitcode if failure_exitcode < 0 else failure_exitcode or 1


def torchrun_main(argv: Sequence[str]) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    die_with_parent()  # torchrun then stops its ranks
    args = parse_args(list(argv))
    started = time.monotonic()
    try:
        run(args)
    except ChildFailedError as error:
        rank, failure = error.get_first_failure()
        code = exit_code_of(failure.exitcode)
        cause = f"signal {failure.signal_name()}" if failure.exitcode < 0 else f"exit code {failure.exitcode}"
        print(
            f"error: rank {rank} failed first ({cause}) after {time.monotonic() - started:.1f} s; "
            f"{len(error.failures)} rank(s) failed; exiting with {code}",
            file=sys.stderr,
            flush=True,
        )
        return code
    except SignalException as error:  # torchrun stopped its ranks on SIGTERM/SIGINT before this
        print(f"error: stopped by {error.sigval.name}; every rank was stopped", file=sys.stderr, flush=True)
        return 128 + int(error.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(torchrun_main(sys.argv[1:]))
