"""One training per device: two processes asking for the same device's slot on one Prefect server take
turns, the second saying what it waits for; the limit is created on first use with one slot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from slot_support import CEILING, Holder

from tasks.device_slot import device_limit_names

pytestmark = pytest.mark.integration


@pytest.mark.timeout(2 * CEILING)
def test_two_machines_on_one_server_hold_their_own_slots_at_once(prefect_env: dict[str, str]) -> None:
    holders = [Holder("cpu", {**prefect_env, "GPTPIPE_MACHINE": name}) for name in ("box-a", "box-b")]
    for holder in holders:
        holder.until("holding")  # both hold their machine's CPU before either lets go
    for holder in holders:
        holder.release()
    for holder in holders:
        holder.until("released")
        assert holder.process.wait() == 0 and holder.said() == []


def take_turns(device: str, environments: list[dict[str, str]]) -> list[str]:
    """The second holder asks for `device`'s slot only once the first holds it, so the order is the
    test's, not the scheduler's; what the second said while it waited."""
    first = Holder(device, environments[0])
    first.until("holding")
    second = Holder(device, environments[1])
    assert "said" in second.next_line(), "the second waits while the first holds the slot"
    first.release()
    second.release()  # it lets go once it holds the slot
    released = first.until("released")["released"]
    assert second.until("holding")["holding"] >= released - 0.05  # only once the first let it go
    assert first.process.wait() == 0 and second.process.wait() == 0
    return second.said()


@pytest.mark.timeout(2 * CEILING)
def test_two_trainings_on_one_device_take_turns(prefect_env: dict[str, str]) -> None:
    said = take_turns("slot-test", [prefect_env, prefect_env])
    waited = device_limit_names("slot-test")[0]
    assert said == [f"waiting for {waited}: another training or evaluation holds the device"]


@pytest.mark.timeout(2 * CEILING)
def test_two_processes_of_one_machine_take_turns_whatever_their_temporary_folders(
    prefect_env: dict[str, str],
    tmp_path: Path,
) -> None:
    environments = []
    for folder in (tmp_path / "a", tmp_path / "b"):
        folder.mkdir()
        environments.append({**prefect_env, "GPTPIPE_MACHINE": "box-c", "TMPDIR": str(folder)})
    said = take_turns("cpu", environments)
    assert said == ["waiting for gptpipe-device-box-c-cpu: another training or evaluation holds the device"]


@pytest.mark.timeout(2 * CEILING)
def test_the_machines_locks_are_in_the_folder_gptpipe_machine_locks_names(
    prefect_env: dict[str, str], tmp_path: Path
) -> None:
    """The suite gives each run a folder of its own (tests/conftest.py): two suites on one host never
    wait for each other's slots in /tmp."""
    env = {**prefect_env, "GPTPIPE_MACHINE": "box-d", "GPTPIPE_MACHINE_LOCKS": str(tmp_path)}
    holder = Holder("cpu", env)
    holder.until("holding")
    record = json.loads((tmp_path / "gptpipe-device-box-d-cpu.lock.json").read_text())  # its holder's
    holder.release()
    holder.until("released")
    assert holder.process.wait() == 0 and record["pid"] == holder.process.pid
    assert not Path("/tmp/gptpipe-device-box-d-cpu.lock").exists()


def test_a_training_holds_one_limit_per_gpu_it_uses() -> None:
    assert device_limit_names("cpu", machine="gpu-box-1") == ["gptpipe-device-gpu-box-1-cpu"]
    assert device_limit_names("cuda", 2, machine="a") == [
        "gptpipe-device-a-cuda-0",
        "gptpipe-device-a-cuda-1",
    ]
