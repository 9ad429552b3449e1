"""One training per device: two processes asking for the same device's slot on one Prefect server take
turns, the second saying what it waits for; the limit is created on first use with one slot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.device_slot import device_limit_names

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parent.parent

HOLDER = """
import json, sys, time
from tasks.device_slot import device_slot
with device_slot(sys.argv[1], announce=lambda line: print(json.dumps({"said": line}), flush=True)):
    started = time.time()
    time.sleep(1.5)
print(json.dumps({"held": [started, time.time()]}), flush=True)
"""


def hold_at_once(envs: list[dict[str, str]], device: str) -> tuple[list[list[float]], list[str]]:
    """Start one holder of `device`'s slot per environment at once; when each held it (start, end), in
    the order they took it, and what they said while waiting."""
    holders = [
        subprocess.Popen(
            [sys.executable, "-c", HOLDER, device], env=env, cwd=REPO, stdout=subprocess.PIPE, text=True
        )
        for env in envs
    ]
    lines = [
        [json.loads(line) for line in holder.communicate(timeout=120)[0].splitlines()] for holder in holders
    ]
    assert all(holder.returncode == 0 for holder in holders)
    held = sorted((next(x["held"] for x in out if "held" in x) for out in lines), key=lambda h: h[0])
    return held, [x["said"] for out in lines for x in out if "said" in x]


@pytest.mark.slow
def test_two_trainings_on_one_device_take_turns(prefect_env: dict[str, str]) -> None:
    (first, second), said = hold_at_once([prefect_env, prefect_env], "slot-test")
    assert second[0] >= first[1] - 0.05  # the second held the slot only once the first let it go
    waited = device_limit_names("slot-test")[0]
    assert said == [f"waiting for {waited}: another training or evaluation holds the device"]


# Holds the slot until the file named by its second argument exists.
HOLD_UNTIL = """
import json, pathlib, sys, time
from tasks.device_slot import device_slot
say = lambda **line: print(json.dumps(line), flush=True)
release = pathlib.Path(sys.argv[2])
with device_slot(sys.argv[1], announce=lambda line: say(said=line)):
    say(holding=time.time())
    while not release.exists():
        time.sleep(0.05)
    say(released=time.time())
"""
CEILING = 120  # against a hang only: a slot is taken in about a second


class Holder:
    """A process holding `device`'s slot until `release` exists, its JSON lines read as they come."""

    def __init__(self, device: str, release: Path, env: dict[str, str], prefix: list[str] = ()) -> None:
        command = [*prefix, sys.executable, "-c", HOLD_UNTIL, device, str(release)]
        self.process = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, text=True)
        self.lines: list[dict] = []

    def next_line(self) -> dict:
        line = self.process.stdout.readline()  # the test's timeout ends a hang
        assert line, f"the holder exited ({self.process.wait()}) before saying more: {self.lines}"
        self.lines.append(json.loads(line))
        return self.lines[-1]

    def until(self, key: str) -> dict:
        while key not in (line := self.next_line()):
            pass
        return line

    def said(self) -> list[str]:
        return [line["said"] for line in self.lines if "said" in line]


@pytest.mark.timeout(2 * CEILING)
def test_two_machines_on_one_server_hold_their_own_slots_at_once(
    prefect_env: dict[str, str], tmp_path: Path
) -> None:
    release = tmp_path / "release"
    holders = [
        Holder("cpu", release, {**prefect_env, "GPTPIPE_MACHINE": name}) for name in ("box-a", "box-b")
    ]
    for holder in holders:
        holder.until("holding")  # both hold their machine's CPU before either lets go
    release.touch()
    for holder in holders:
        holder.until("released")
        assert holder.process.wait() == 0 and holder.said() == []


@pytest.mark.timeout(2 * CEILING)
def test_two_processes_of_one_machine_take_turns_whatever_their_temporary_folders(
    prefect_env: dict[str, str], tmp_path: Path
) -> None:
    release = tmp_path / "release"
    environments = []
    for folder in (tmp_path / "a", tmp_path / "b"):
        folder.mkdir()
        environments.append({**prefect_env, "GPTPIPE_MACHINE": "box-c", "TMPDIR": str(folder)})
    first = Holder("cpu", release, environments[0])
    first.until("holding")
    second = Holder("cpu", release, environments[1])
    assert "said" in second.next_line(), "the second waits while the first holds the machine's CPU"
    release.touch()
    released = first.until("released")["released"]
    assert second.until("holding")["holding"] >= released - 0.05
    assert second.said() == [
        "waiting for gptpipe-device-box-c-cpu: another training or evaluation holds the device"
    ]
    assert first.process.wait() == 0 and second.process.wait() == 0


def test_a_training_holds_one_limit_per_gpu_it_uses() -> None:
    assert device_limit_names("cpu", machine="gpu-box-1") == ["gptpipe-device-gpu-box-1-cpu"]
    assert device_limit_names("cuda", 2, machine="a") == [
        "gptpipe-device-a-cuda-0",
        "gptpipe-device-a-cuda-1",
    ]
