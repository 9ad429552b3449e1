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


def test_two_trainings_on_one_device_take_turns(prefect_env: dict[str, str]) -> None:
    holders = [
        subprocess.Popen(
            [sys.executable, "-c", HOLDER, "slot-test"],
            env=prefect_env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    lines = [
        [json.loads(line) for line in holder.communicate(timeout=120)[0].splitlines()] for holder in holders
    ]
    assert all(holder.returncode == 0 for holder in holders)
    (first, second) = sorted(
        (next(x["held"] for x in out if "held" in x) for out in lines), key=lambda h: h[0]
    )
    assert second[0] >= first[1] - 0.05  # the second held the slot only once the first let it go
    said = [x["said"] for out in lines for x in out if "said" in x]
    assert said == ["waiting for gptpipe-device-slot-test: another training holds the device"]


def test_a_training_holds_one_limit_per_gpu_it_uses() -> None:
    assert device_limit_names("cpu") == ["gptpipe-device-cpu"]
    assert device_limit_names("cuda", 2) == ["gptpipe-device-cuda-0", "gptpipe-device-cuda-1"]
