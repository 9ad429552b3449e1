"""Compiling the training step's model, proved at start-up by a probe, its cost its own figure.

`torch.compile` is lazy: the graphs are built by the first forward and backward. The probe runs one of
each at the training's micro-batch shape on random tokens (a private generator, the RNG state put back,
the gradients cleared), so compilation happens before the first step and `compile_seconds` stays out of
every rate, and a compiler that fails is found before training: with `compile: auto` the run trains
eager and says why in its start-up record; asked for explicitly, it stops in one line. Evaluation runs
the uncompiled model, and every step has the same shapes: nothing should compile again, and
`recompilations` counts it when something does.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from gptcore.errors import TrainingError, first_line
from gptcore.runtime.decided import Runtime
from gptcore.runtime.memory import is_out_of_memory


def compiled_graphs() -> int:
    """Graphs torch.compile has built in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def compile_for_training(
    replica: torch.nn.Module, runtime: Runtime, micro_batch: int, block_size: int, vocab_size: int
) -> tuple[torch.nn.Module, Runtime, float | None]:
    """(the module steps run, the runtime as it turned out, compile seconds or None when eager)."""
    if not runtime.compile:
        return replica, runtime, None
    compiled = torch.compile(replica)
    started = time.perf_counter()
    try:
        _probe(compiled, runtime, micro_batch, block_size, vocab_size)
    except Exception as error:  # the compiler stack raises many kinds (dynamo, inductor, a C compiler)
        _clear_gradients(replica)
        if is_out_of_memory(error):
            raise
        reason = first_line(f"{type(error).__name__}: {error}", 300)
        if runtime.compile_source == "requested":
            raise TrainingError(
                f"runtime.compile: the compiler failed at start-up ({reason}); set runtime.compile to auto "
                "or false to train eager"
            ) from None
        source = f"{runtime.compile_source}, but the compiler failed at start-up ({reason}): eager"
        return replica, replace(runtime, compile=False, compile_source=source), None
    _clear_gradients(replica)
    return compiled, runtime, round(time.perf_counter() - started, 3)


def _probe(module: torch.nn.Module, runtime: Runtime, micro_batch: int, block_size: int, vocab: int) -> None:
    generator = torch.Generator().manual_seed(0)
    window = torch.randint(0, vocab, (micro_batch, block_size + 1), generator=generator).to(runtime.device)
    devices = [torch.device(runtime.device)] if runtime.device == "cuda" else []
    with torch.random.fork_rng(devices=devices):  # dropout in the probe leaves the run's RNG as it was
        with runtime.autocast():
            _, loss = module(window[:, :-1], window[:, 1:])
        loss.backward()


def _clear_gradients(module: torch.nn.Module) -> None:
    for parameter in module.parameters():
        parameter.grad = None
