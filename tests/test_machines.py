"""Several machines, simulated for real: network namespaces the test makes, each machine its own host name
(a UTS namespace) and temporary folder, and one Prefect server in a namespace of its own that both reach
at a non-loopback address. Device slots are per machine: two machines hold their CPU slot at once, two
processes of one machine take turns, and a holder killed with `kill -9` gives its slot back when the
server's lease runs out (no loopback take-back: the server is not on this machine's loopback)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from process_support import migrated_prefect_home
from slot_support import Holder

from tasks.device_slot import LEASE_SECONDS, LOCKS_VARIABLE

REPO = Path(__file__).resolve().parent.parent
PORT = 4200  # inside the server's own namespace: nothing else listens there


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "ip (iproute2) and unshare (util-linux) are needed"
    probe = f"gpt-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        return f"cannot make a network namespace here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], check=False)
    return None


pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(_why_not() is not None, reason=_why_not() or ""),
]


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass
class Machine:
    """A simulated machine: its namespace, host name, temporary folder and the server's address."""

    namespace: str
    hostname: str
    api_url: str
    root: Path

    def holder(self, tmp: str) -> Holder:
        """A device-slot holder running on this machine (its own TMPDIR `tmp`)."""
        folder = self.root / tmp
        folder.mkdir(parents=True, exist_ok=True)
        env = {  # the suite's own folder of machine locks kept: nothing left in /tmp
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("PREFECT_", "GPTPIPE_")) or name == LOCKS_VARIABLE
        }
        env.update(
            PREFECT_API_URL=self.api_url, PREFECT_HOME=str(folder / "prefect"), TMPDIR=str(folder),
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
        )  # fmt: skip
        prefix = ["ip", "netns", "exec", self.namespace, "unshare", "--uts", "sh", "-c"]
        prefix += ['hostname "$0" && exec "$@"', self.hostname]  # the machine's name is its host name
        return Holder("cpu", env, prefix=prefix)


@pytest.fixture(scope="module")
def machines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Machine]]:
    tag = os.getpid() % 100000
    server, names = f"gpt{tag}-srv", {"a": f"gpt{tag}-a", "b": f"gpt{tag}-b"}
    made: list[str] = []
    process = None
    try:
        for namespace in (server, *names.values()):
            ip("netns", "add", namespace)
            made.append(namespace)
            ip("-n", namespace, "link", "set", "lo", "up")
        found = {}
        for subnet, (key, namespace) in enumerate(names.items(), start=1):
            # A cable from each machine to the server's namespace: 10.231.N.2 (machine) to 10.231.N.1.
            near, far = f"gm{tag}{key}", f"gs{tag}{key}"
            ip("link", "add", near, "netns", namespace, "type", "veth", "peer", "name", far, "netns", server)
            ip("-n", namespace, "addr", "add", f"10.231.{subnet}.2/24", "dev", near)
            ip("-n", server, "addr", "add", f"10.231.{subnet}.1/24", "dev", far)
            ip("-n", namespace, "link", "set", near, "up")
            ip("-n", server, "link", "set", far, "up")
            root = tmp_path_factory.mktemp(f"machine-{key}")
            found[key] = Machine(namespace, f"box-{key}-{tag}", f"http://10.231.{subnet}.1:{PORT}/api", root)
        home = migrated_prefect_home(tmp_path_factory.mktemp("server-home"))
        env = {name: value for name, value in os.environ.items() if not name.startswith("PREFECT_")}
        env.update(
            PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_UI_ENABLED="false"
        )
        command = ["ip", "netns", "exec", server, sys.executable, "-m", "prefect", "server", "start"]
        command += ["--host", "0.0.0.0", "--port", str(PORT)]
        process = subprocess.Popen(
            command, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        for machine in found.values():  # each machine reaches the server at its own side of its cable
            wait_for_health(machine)
        yield found
    finally:
        if process is not None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)
        for namespace in made:
            subprocess.run(["ip", "netns", "del", namespace], check=False)


def wait_for_health(machine: Machine) -> None:
    probe = (
        "import sys, time, urllib.request\n"
        "for _ in range(600):\n"
        "    try:\n"
        "        urllib.request.urlopen(sys.argv[1] + '/health', timeout=2); sys.exit(0)\n"
        "    except OSError: time.sleep(0.2)\n"
        "sys.exit(1)\n"
    )
    command = ["ip", "netns", "exec", machine.namespace, sys.executable, "-c", probe, machine.api_url]
    assert subprocess.run(command, timeout=180, check=False).returncode == 0, "the server never answered"


@pytest.mark.timeout(300)
def test_two_machines_hold_their_slots_at_once_and_one_machines_processes_take_turns(
    machines: dict[str, Machine],
) -> None:
    a, b = machines["a"], machines["b"]
    first = a.holder("first")
    first.until("holding")
    other_machine = b.holder("first")
    other_machine.until("holding")  # box-b's CPU is its own: held while box-a's is held
    same_machine = a.holder("second")  # box-a again, another temporary folder
    waits = f"waiting for gptpipe-device-{a.hostname}-cpu: another training or evaluation holds the device"
    assert same_machine.next_line() == {"said": waits}
    holders = {"box-a 1": first, "box-b": other_machine, "box-a 2": same_machine}
    for holder in holders.values():
        holder.release()  # box-a's second lets go as soon as it holds
    released = first.until("released")["released"]
    assert same_machine.until("holding")["holding"] >= released - 0.05  # only once box-a's first let go
    other_machine.until("released")
    same_machine.until("released")
    assert all(holder.process.wait(timeout=60) == 0 for holder in holders.values())
    assert first.said() == [] and other_machine.said() == []
    start = min(line["holding"] for holder in holders.values() for line in holder.lines if "holding" in line)
    for name, holder in holders.items():
        span = [line[key] - start for line in holder.lines for key in ("holding", "released") if key in line]
        print(f"{name}: held from {span[0]:.2f} s to {span[1]:.2f} s")


@pytest.mark.waits  # a minute for Prefect's lease to run out
@pytest.mark.timeout(LEASE_SECONDS * 5)
def test_a_holder_killed_with_kill_9_gives_its_slot_back_when_the_lease_runs_out(
    machines: dict[str, Machine],
) -> None:
    a = machines["a"]
    first = a.holder("killed")  # never released: it holds until it is killed
    first.until("holding")
    waiting = a.holder("waiting")
    assert "said" in waiting.next_line()
    first.process.send_signal(signal.SIGKILL)  # no handler runs: its Prefect slot stays taken
    killed = time.time()
    assert first.process.wait(timeout=30) == -signal.SIGKILL
    held = waiting.until("holding")["holding"]  # once the server's reaper sees the lease expired
    print(f"slot back {held - killed:.1f} s after kill -9 (lease {LEASE_SECONDS} s)")
    waiting.release()
    waiting.until("released")
    assert waiting.process.wait(timeout=60) == 0
