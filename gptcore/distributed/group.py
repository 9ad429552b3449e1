"""Data-parallel processes: the process group torchrun describes, rank helpers, each rank's share of data.

torchrun starts one process per device and tells each who it is through environment variables (`RANK`,
`LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`). `process_group` turns
them into an initialised group (NCCL on CUDA, Gloo on CPU) for the length of a `with` block; outside
torchrun it is a world of one and does nothing, so the same code runs both ways.

Data: an epoch's order is fixed by (seed, epoch) alone. An optimizer step takes the next global batch
of it, `batch x accumulation x world` examples; micro-step m of the step takes the next `batch x world`
of those, and rank r takes the r-th `batch` of that slice. The step's examples are therefore the same
whatever the number of ranks (for the same global batch), no example repeats within an epoch, and only
the remainder that does not fill a step is left out.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from gptcore.distributed.torchrun import under_torchrun
from gptcore.errors import ConfigError

TIMEOUT_VARIABLE = "GPTPIPE_DIST_TIMEOUT"
DEFAULT_TIMEOUT_SECONDS = 1800.0  # torch's own default; tests set a short one through the variable
_WORLD_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


@dataclass(frozen=True)
class World:
    """Who this process is among the job's processes."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


SINGLE = World()


def _env_int(env: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = env.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"environment {name}={raw!r}: expected an integer (set by torchrun)") from None
    if value < minimum:
        raise ConfigError(f"environment {name}={value}: must be at least {minimum}")
    return value


def world_from_env(env: Mapping[str, str] | None = None) -> World:
    """The world torchrun's variables describe; a world of one when they are absent."""
    env = os.environ if env is None else env
    if not under_torchrun(env):
        return SINGLE
    world_size = _env_int(env, "WORLD_SIZE", 1, 1)
    rank = _env_int(env, "RANK", 0, 0)
    local_world_size = _env_int(env, "LOCAL_WORLD_SIZE", world_size, 1)
    local_rank = _env_int(env, "LOCAL_RANK", rank, 0)
    if rank >= world_size:
        raise ConfigError(f"environment RANK={rank}: must be below WORLD_SIZE={world_size}")
    if local_rank >= local_world_size:
        raise ConfigError(
            f"environment LOCAL_RANK={local_rank}: must be below LOCAL_WORLD_SIZE={local_world_size}"
        )
    return World(rank, local_rank, world_size, local_world_size)


def backend_for(device: str) -> str:
    return "nccl" if device == "cuda" else "gloo"


def collective_timeout(env: Mapping[str, str] | None = None) -> timedelta:
    """How long a collective waits for a silent peer before failing (`GPTPIPE_DIST_TIMEOUT` seconds)."""
    env = os.environ if env is None else env
    raw = env.get(TIMEOUT_VARIABLE)
    if raw is None:
        return timedelta(seconds=DEFAULT_TIMEOUT_SECONDS)
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        raise ConfigError(f"environment {TIMEOUT_VARIABLE}={raw!r}: expected a positive number of seconds")
    return timedelta(seconds=seconds)


@contextlib.contextmanager
def process_group(device: str, world: World | None = None) -> Iterator[World]:
    """Join the job's process group for the block (a no-op for a world of one outside torchrun).

    On CUDA each process takes the GPU of its local rank first, so `"cuda"` means that GPU from here on.
    The group is torn down on the way out, also when the block fails."""
    world = world or world_from_env()
    if not under_torchrun() and not world.distributed:
        yield world
        return
    if device == "cuda":
        if world.local_rank >= torch.cuda.device_count():
            raise ConfigError(
                f"local rank {world.local_rank} has no GPU: {torch.cuda.device_count()} visible; "
                "use --nproc auto (one process per visible GPU) or fewer processes"
            )
        torch.cuda.set_device(world.local_rank)
    dist.init_process_group(
        backend_for(device), rank=world.rank, world_size=world.world_size, timeout=collective_timeout()
    )
    try:
        yield world
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def leave_rank(code: int) -> None:
    """End a torchrun rank without interpreter finalization. Gloo's worker threads release a finished
    collective's tensors after the caller has its result; one still doing so when finalization begins
    wants the GIL, is ended by Python inside C++ code, and the process aborts (std::terminate, SIGABRT)
    after a run that succeeded. Everything a rank produces is written and flushed before this."""
    import logging
    import sys

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


# --- collectives that are no-ops in a world of one ---------------------------------------------------


def _active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum over ranks, in place; returned for chaining."""
    if _active():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """Mean over ranks of a copy (the caller's tensor is left as it was)."""
    if not _active():
        return tensor
    reduced = tensor.detach().clone()
    dist.all_reduce(reduced, op=dist.ReduceOp.SUM)
    return reduced / dist.get_world_size()


def agree_on_int(value: int, what: str, device: str = "cpu") -> int:
    """The value, checked to be the same on every rank (a rank that differs means a broken setup)."""
    if not _active():
        return value
    pair = torch.tensor([value, -value], dtype=torch.int64, device=device)
    dist.all_reduce(pair, op=dist.ReduceOp.MAX)
    largest, smallest = int(pair[0]), -int(pair[1])
    if largest != smallest:
        raise ConfigError(
            f"ranks disagree on {what}: from {smallest} to {largest}; every rank must see the same "
            "checkpoint directory and data (shared storage on multi-node jobs)"
        )
    return value


class DistributedGradScaler(torch.amp.GradScaler):
    """A GradScaler whose overflow check agrees across ranks.

    `unscale_` finds infinities in this rank's gradients only. DDP makes gradients equal across ranks
    before that, but a rank whose check says otherwise would skip a step the others take and the model
    copies would part for good; summing the per-rank flags makes every rank skip together (what
    torch's FSDP ShardedGradScaler does)."""

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        super().unscale_(optimizer)
        if not (self.is_enabled() and _active()):
            return
        for found_inf in self._found_inf_per_device(optimizer).values():
            dist.all_reduce(found_inf, op=dist.ReduceOp.SUM)


def grad_scaler(device: str, enabled: bool, world_size: int) -> torch.amp.GradScaler:
    kind = DistributedGradScaler if world_size > 1 else torch.amp.GradScaler
    return kind(device, enabled=enabled)


# --- each rank's share of the data ---------------------------------------------------------------------


def check_rank(world_size: int, rank: int) -> None:
    if world_size < 1:
        raise ConfigError(f"world size {world_size}: must be at least 1")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank}: must be in 0..{world_size - 1} for a world of {world_size}")


def rank_micro_batches(
    order: np.ndarray, step_in_epoch: int, batch_size: int, grad_accum_steps: int, world_size: int, rank: int
) -> list[np.ndarray]:
    """This rank's micro-batches (example indices) of one optimizer step of the epoch's `order`.

    Micro-step m takes the global slice `[m*b*W, (m+1)*b*W)` of the step and rank r its r-th `b`, so
    piece `m*W + r` of the step is the same piece a single process with accumulation `k*W` takes at
    micro-step `m*W + r`."""
    check_rank(world_size, rank)
    global_batch = batch_size * grad_accum_steps * world_size
    start = step_in_epoch * global_batch
    if start + global_batch > len(order):
        raise ConfigError(
            f"step {step_in_epoch} of the epoch needs examples up to {start + global_batch}; "
            f"the epoch has {len(order)}"
        )
    micro = batch_size * world_size
    return [
        order[start + m * micro + rank * batch_size : start + m * micro + (rank + 1) * batch_size]
        for m in range(grad_accum_steps)
    ]


def rank_range(count: int, world_size: int, rank: int) -> range:
    """A contiguous, near-equal share of `count` items (evaluation: each rank scores its part)."""
    check_rank(world_size, rank)
    base, extra = divmod(count, world_size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


def agree_on_min(value: int, device: str = "cpu") -> int:
    """The smallest of every rank's `value` (a batch size each rank found to fit), the same on all."""
    if not _active():
        return value
    smallest = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(smallest, op=dist.ReduceOp.MIN)
    return int(smallest.item())
