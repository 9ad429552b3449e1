"""glibc malloc settings for CPU training: large tensors reused from the heap instead of fresh mmaps.

glibc serves every allocation above its mmap threshold (at most 32 MiB when it adapts the threshold
itself) with a fresh `mmap` and returns it with `munmap` on free. A CPU training step allocates and
frees several arrays larger than that every step (the `tokens x vocabulary` logits, their log-
probabilities and gradient: 64 MiB each for `gpt_first_cpu` at batch 8), so every step page-faults
and zero-fills them again: about a tenth of an fp32 step on 2 cores. Raising the mmap threshold to
256 MiB and keeping up to 512 MiB of freed heap (the trim threshold) lets those arrays be reused;
peak RSS grows by about 100 MB.

The settings must be made before torch is imported (set afterwards, they measurably did not help), so
`gptpipe` makes them first thing. They are also exported as `GLIBC_TUNABLES`, which glibc reads at
process start, for child processes (torchrun ranks, Prefect's server). A user's own `GLIBC_TUNABLES` or
`MALLOC_*_` variables win, and `GPTPIPE_MALLOC_TUNING=0` turns all of it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

MMAP_THRESHOLD_BYTES = 256 * 2**20
TRIM_THRESHOLD_BYTES = 512 * 2**20
# mallopt parameter numbers from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
TUNABLES = (
    f"glibc.malloc.mmap_threshold={MMAP_THRESHOLD_BYTES}:glibc.malloc.trim_threshold={TRIM_THRESHOLD_BYTES}"
)
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def _settings(mmap_threshold: int, trim_threshold: int) -> str:
    return f"glibc mmap_threshold={mmap_threshold >> 20}MiB trim_threshold={trim_threshold >> 20}MiB"


TUNED = _settings(MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES)

_state: str | None = None  # what tune_malloc found or did; None until it runs


def tune_malloc() -> str:
    """Apply the settings to this process and export them for its children; returns `describe()`."""
    global _state
    if _state is None:
        _state = _tune()
    return _state


def describe() -> str:
    """What this process runs with: the tuned settings, the user's own, or glibc's defaults."""
    if _state is not None:
        return _state
    return f"{TUNED} (inherited)" if _inherited() else "default"  # e.g. a Prefect worker's flow run


def _inherited() -> bool:
    """glibc applied the settings at this process's start (a torchrun rank, a deployment's flow run)."""
    return TUNABLES in os.environ.get("GLIBC_TUNABLES", "")


def _tune() -> str:
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if os.environ.get("GPTPIPE_MALLOC_TUNING", "1") == "0":
        return "default (GPTPIPE_MALLOC_TUNING=0)"
    if _inherited():
        return f"{TUNED} (inherited)"
    if "glibc.malloc" in tunables or any(map(os.environ.get, _USER_SETTINGS)):
        return "user settings (GLIBC_TUNABLES / MALLOC_*_)"
    if not sys.platform.startswith("linux") or not _mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES):
        return "default"
    _mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    os.environ["GLIBC_TUNABLES"] = f"{tunables}:{TUNABLES}" if tunables else TUNABLES
    return TUNED


def _glibc(function: str, *arguments: int) -> int | None:
    """Call a glibc malloc function; None where there is none (musl, macOS): the allocator is left alone."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return int(getattr(libc, function)(*arguments))
    except (OSError, AttributeError):
        return None


def _mallopt(parameter: int, value: int) -> bool:
    return bool(_glibc("mallopt", parameter, value))


# With activation checkpointing the backward pass recomputes each block between the gradients'
# allocations, and a heap that keeps freed arrays leaves them as holes the next arrays do not fit:
# for gpt_42m at batch 2 on CPU the resident peak stayed 24% under the plain run's instead of the
# live bytes' 44%. Arrays of 4 MiB and more then come from (and go back to) the kernel: the resident
# peak drops by half, each step pays the page faults (bench/memory_estimate.py).
LEAN_MMAP_THRESHOLD_BYTES = 4 * 2**20
LEAN_TRIM_THRESHOLD_BYTES = 64 * 2**20
LEAN = _settings(LEAN_MMAP_THRESHOLD_BYTES, LEAN_TRIM_THRESHOLD_BYTES)


def favour_memory() -> str:
    """Switch this process's heap to return large arrays to the kernel when freed (activation
    checkpointing); the user's own settings are left alone. Returns `describe()`."""
    global _state
    if describe().startswith("user settings") or not sys.platform.startswith("linux"):
        return describe()
    if _mallopt(_M_MMAP_THRESHOLD, LEAN_MMAP_THRESHOLD_BYTES):
        _mallopt(_M_TRIM_THRESHOLD, LEAN_TRIM_THRESHOLD_BYTES)
        _state = f"{LEAN} (activation checkpointing: memory over speed)"
    return describe()


def release_free_heap() -> bool:
    """Hand the heap's free pages back to the kernel (glibc `malloc_trim(0)`), so the resident set is
    what live objects hold: a measurement that starts after it sees new allocations as growth instead
    of silent reuse of freed pages. False where the allocator is not glibc."""
    return _glibc("malloc_trim", 0) is not None
