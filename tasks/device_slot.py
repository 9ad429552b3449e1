"""One computation per device: every stage that computes on a device (smoke and full training, evaluate,
quantize), whether a sweep, `gptpipe run` or a deployment started it, holds that device's slot while it
computes, so its figures are measured alone.

A device is a machine's: the slot's names carry the machine (`gptpipe-device-<machine>-cpu`,
`gptpipe-device-<machine>-cuda-<i>`; the host name, or `GPTPIPE_MACHINE`), so trainings on two machines
that share a Prefect server run at once, and two on one machine take turns. Two locks, in this order:
1. A machine-wide file lock per device (`/tmp/gptpipe-device-<machine>-cpu.lock`, `gptcore.tools.locks`):
   processes of this machine take turns whatever Prefect server they talk to and whatever their `TMPDIR`
   says, and the kernel lets go of it when its holder dies, even by `kill -9`. `GPTPIPE_MACHINE_LOCKS`
   names another folder for them (every process that is to take turns must name the same one): the test
   suite gives each run its own, so two suites on one host never wait for each other.
2. The Prefect global concurrency limit of the same name, created on first use with one slot: what the
   Prefect UI shows. A limit someone changed (more slots, inactive) is used as it is.

A holder killed outright leaves its Prefect slot taken until the server's lease expires (60 s, renewed
while held), and a temporary Prefect server (the one `gptpipe run` starts, which runs no lease reaper)
keeps it taken for good. So when the server is on loopback, which only this machine's processes reach,
and this process holds the machine's lock, nobody alive can hold the slot: it is taken back at once. The
checkpoint directory's lock (`gptcore.checkpoint.lock`) stays as a further guard.
"""

from __future__ import annotations

import os
import re
import socket
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from urllib.parse import urlsplit

from gptcore.tools.locks import HeldLock

PREFIX = "gptpipe-device"
LEASE_SECONDS = 60  # Prefect's shortest; renewed while held: a killed holder's slot returns in a minute
LOOPBACK = ("127.0.0.1", "localhost", "::1")
MACHINE_VARIABLE = "GPTPIPE_MACHINE"  # the machine's name in slot names; the host name by default
# Not $TMPDIR: two processes of one machine with different temporary folders must meet at one lock.
MACHINE_LOCKS = Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir())
LOCKS_VARIABLE = "GPTPIPE_MACHINE_LOCKS"  # another folder for the machine's locks (a test suite's own)


def machine_name() -> str:
    """This machine's name as a slot's names hold it: `GPTPIPE_MACHINE`, else the host name; lowercase
    letters, digits and dashes."""
    name = os.environ.get(MACHINE_VARIABLE) or socket.gethostname()
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "machine"


def machine_locks() -> Path:
    """The folder of this machine's device locks: `GPTPIPE_MACHINE_LOCKS`, else `/tmp`."""
    return Path(os.environ.get(LOCKS_VARIABLE) or MACHINE_LOCKS)


def device_limit_names(device: str, processes: int = 1, machine: str | None = None) -> list[str]:
    """The limits a computation on `device` with `processes` local processes holds: one per GPU it uses,
    each named after this machine (or `machine`)."""
    prefix = f"{PREFIX}-{machine or machine_name()}"
    if device == "cuda":
        return [f"{prefix}-cuda-{index}" for index in range(processes)]
    return [f"{prefix}-{device}"]


@contextmanager
def device_slot(device: str, processes: int = 1, announce: Callable[[str], None] = print) -> Iterator[None]:
    """Hold the device's slot for the block; when another computation holds it, say so and wait."""
    from prefect.concurrency.sync import concurrency

    names = device_limit_names(device, processes)
    waiting = f"waiting for {', '.join(names)}: another training or evaluation holds the device"
    with ExitStack() as held:
        for name in names:
            held.enter_context(_machine_lock(name, lambda: announce(waiting)))
        if not ensure_limits(names, reclaim=_local_server()):
            announce(waiting)  # a holder elsewhere that shares this server (a machine of the same name)
        with concurrency(names, occupy=1, strict=True, lease_duration=LEASE_SECONDS):
            yield


@contextmanager
def _machine_lock(name: str, on_wait: Callable[[], None]) -> Iterator[None]:
    """The machine-wide file lock of one device limit (its holder recorded beside it, for a person
    looking); `on_wait` is called when it has to be waited for."""
    lock = HeldLock(machine_locks() / f"{name}.lock")
    if not lock.try_acquire():
        on_wait()
        lock.acquire()
    try:
        lock.write_holder()
        yield
    finally:
        lock.release()


def _local_server() -> bool:
    """The Prefect API is on loopback: only this machine's processes take its slots."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value() or ""
    return urlsplit(url).hostname in LOOPBACK


def ensure_limits(names: list[str], reclaim: bool = False) -> bool:
    """Create each missing limit with one slot (two processes racing to create one both succeed). With
    `reclaim` (the caller holds the machine's locks and the server is local), slots still taken are
    ones their dead holders leaked: they are given back. Returns whether every limit has a slot free
    now (read, not taken: only whether to say that the caller waits)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    free = True
    with get_client(sync_client=True) as client:
        for name in names:
            try:
                limit = client.read_global_concurrency_limit_by_name(name)
            except ObjectNotFound:
                with suppress(ObjectAlreadyExists):
                    client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
                continue
            if reclaim and limit.active_slots > 0:
                client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(active_slots=0))
                continue
            free = free and (not limit.active or limit.active_slots < limit.limit)
    return free
