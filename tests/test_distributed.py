"""Data-parallel plumbing without a training run: each rank's share of an epoch, torchrun's environment,
the overflow check agreeing across ranks, the torchrun command, and stopping a launched process tree."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import psutil
import pytest
from process_support import two_ranks

from gptcore.data.batches import StepPlan, epoch_order
from gptcore.distributed.group import (
    World,
    collective_timeout,
    rank_micro_batches,
    rank_range,
    world_from_env,
)
from gptcore.distributed.torchrun import (
    LaunchSpec,
    exit_code_of,
    python_program,
    resolve_nproc,
    torchrun_command,
)
from gptcore.errors import ConfigError
from gptcore.tools.processes import LaunchCancelled, run_process_tree
from gptcore.train.callbacks import TrainingCallback
from gptcore.train.json_lines import JsonLinesReplay

ROOT = Path(__file__).resolve().parent.parent


def epoch_pieces(count: int, batch: int, accum: int, world: int, seed: int = 7) -> list[list[np.ndarray]]:
    """Every rank's micro-batches over one epoch: pieces[rank] = [micro-batch, ...] in step order."""
    order = epoch_order(count, seed, epoch=0)
    steps = count // (batch * accum * world)
    return [
        [
            piece
            for step in range(steps)
            for piece in rank_micro_batches(order, step, batch, accum, world, rank)
        ]
        for rank in range(world)
    ]


# --- sharding -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("count", "batch", "accum", "world"), [(96, 4, 1, 2), (100, 3, 2, 4), (37, 2, 3, 3)])
def test_ranks_read_disjoint_shares_that_cover_the_epoch_but_its_remainder(count, batch, accum, world):
    pieces = epoch_pieces(count, batch, accum, world)
    seen = np.concatenate([np.concatenate(rank_pieces) for rank_pieces in pieces])
    global_batch = batch * accum * world
    assert len(seen) == len(set(seen.tolist())), "an example was read twice in one epoch"
    assert len(seen) == count - count % global_batch, "examples skipped beyond the remainder"
    assert all(len(piece) == batch for rank_pieces in pieces for piece in rank_pieces)


def test_a_step_reads_the_same_examples_whatever_the_number_of_ranks():
    order = epoch_order(240, seed=3, epoch=2)
    # global batch 24 each way: (per-rank batch, accumulation, ranks)
    layouts = [(24, 1, 1), (12, 1, 2), (4, 2, 3), (2, 3, 4), (1, 24, 1), (3, 1, 8)]
    for step in range(240 // 24):
        steps = []
        for batch, accum, world in layouts:
            pieces = [rank_micro_batches(order, step, batch, accum, world, r) for r in range(world)]
            steps.append(sorted(np.concatenate([np.concatenate(p) for p in pieces]).tolist()))
        assert all(s == steps[0] for s in steps), f"step {step} differs between layouts"
        assert steps[0] == sorted(order[step * 24 : (step + 1) * 24].tolist())


def test_micro_step_m_of_rank_r_is_the_single_process_micro_step_m_times_world_plus_r():
    order = epoch_order(64, seed=11, epoch=0)
    single = rank_micro_batches(order, 1, 2, 8, 1, 0)  # one process, accumulation 8
    for rank in range(4):
        for m, piece in enumerate(rank_micro_batches(order, 1, 2, 2, 4, rank)):  # 4 ranks, accumulation 2
            np.testing.assert_array_equal(piece, single[m * 4 + rank])


def test_the_trainers_step_plan_uses_the_same_sharding():
    order = epoch_order(50, seed=1, epoch=0)
    plan = StepPlan(batch_size=2, grad_accum_steps=3, world_size=2, rank=1)
    for got, expected in zip(
        plan.micro_batches(order, 3), rank_micro_batches(order, 3, 2, 3, 2, 1), strict=True
    ):
        np.testing.assert_array_equal(got, expected)


def test_a_step_past_the_epoch_or_a_rank_outside_the_world_is_refused():
    order = epoch_order(10, seed=0, epoch=0)
    with pytest.raises(ConfigError, match="step 2 of the epoch"):
        rank_micro_batches(order, 2, 2, 1, 2, 0)
    with pytest.raises(ConfigError, match=r"rank 2: must be in 0\.\.1"):
        rank_micro_batches(order, 0, 2, 1, 2, 2)


def test_evaluation_shares_split_the_validation_set_without_overlap():
    for count, world in [(10, 3), (2, 4), (64, 2)]:
        shares = [rank_range(count, world, r) for r in range(world)]
        assert [i for share in shares for i in share] == list(range(count))
        assert max(map(len, shares)) - min(map(len, shares)) <= 1


# --- torchrun's environment ------------------------------------------------------------------------------


def test_world_comes_from_torchruns_variables_and_is_single_without_them():
    env = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}
    assert world_from_env(env) == World(rank=3, local_rank=1, world_size=4, local_world_size=2)
    assert world_from_env({}) == World()
    assert not World().distributed and World().is_main


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x': expected an integer"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2: must be below WORLD_SIZE=2"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE=0: must be at least 1"),
    ],
)
def test_a_broken_torchrun_environment_is_named(env, message):
    with pytest.raises(ConfigError, match=message):
        world_from_env(env)


def test_collective_timeout_is_torchs_default_unless_set():
    assert collective_timeout({}).total_seconds() == 1800
    assert collective_timeout({"GPTPIPE_DIST_TIMEOUT": "15"}).total_seconds() == 15
    with pytest.raises(ConfigError, match="GPTPIPE_DIST_TIMEOUT='soon'"):
        collective_timeout({"GPTPIPE_DIST_TIMEOUT": "soon"})


OVERFLOW_PROBE = textwrap.dedent(
    """
    import json, os, torch
    from gptcore.distributed.group import grad_scaler, leave_rank, process_group
    with process_group("cpu") as world:
        weight = torch.nn.Parameter(torch.ones(3))
        optimizer = torch.optim.SGD([weight], lr=0.1)
        scaler = grad_scaler("cpu", enabled=True, world_size=world.world_size)
        inputs = torch.full((3,), float("inf") if world.rank == 1 else 1.0)  # only rank 1 overflows
        scaler.scale((weight * inputs).sum()).backward()
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()
        print(json.dumps({"rank": world.rank, "weight": weight.tolist(), "scale": scaler.get_scale()}))
    leave_rank(0)  # as a gptpipe rank leaves: Gloo's threads may still hold a finished collective
    """
)


@pytest.mark.slow
def test_the_fp16_overflow_check_agrees_across_ranks():
    """Rank 1's gradient overflows, rank 0's does not: both skip the step and back off the scale."""
    codes, outputs = two_ranks(OVERFLOW_PROBE, ROOT)
    assert codes == [0, 0]
    results = [json.loads(output) for output in outputs]
    initial_scale = 2.0**16
    for result in results:
        assert result["weight"] == [1.0, 1.0, 1.0], f"rank {result['rank']} stepped on an overflow"
        assert result["scale"] == initial_scale * 0.5


# --- the launcher ----------------------------------------------------------------------------------------


def test_one_node_launch_is_standalone_and_several_nodes_name_the_rendezvous():
    one = torchrun_command(LaunchSpec(2), "gptcore.train.multiprocess", ["job.json"], python=["nice", "py"])
    launcher = ["nice", "py", "-m", "gptcore.distributed.torchrun", "--nproc-per-node", "2", "--standalone"]
    assert one == [*launcher, "--no-python", "nice", "py", "-m", "gptcore.train.multiprocess", "job.json"]
    spec = LaunchSpec(1, nnodes=2, node_rank=1, rdzv_endpoint="10.0.0.1:29400", rdzv_id="job7")
    assert spec.torchrun_flags() == [
        "--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.1:29400", "--rdzv-id", "job7",
    ]  # fmt: skip
    assert spec.needs_torchrun and not LaunchSpec(1).needs_torchrun


def test_gptpipe_python_runs_the_launcher_and_every_rank_and_one_a_shell_cannot_split_stops_nothing_started(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flows.cli.main import main

    monkeypatch.setenv("GPTPIPE_PYTHON", "nice -n 5 '/opt/my python'")
    command = torchrun_command(LaunchSpec(2), "gptcore.train.multiprocess", ["job.json"])
    wrapper = ["nice", "-n", "5", "/opt/my python"]
    rank = command[command.index("--no-python") + 1 :]
    assert command[:5] == [*wrapper, "-m"]  # the launcher
    assert rank == [*wrapper, "-m", "gptcore.train.multiprocess", "job.json"]  # each rank
    monkeypatch.setenv("GPTPIPE_PYTHON", " ")
    assert python_program() == [sys.executable]

    monkeypatch.setenv("GPTPIPE_PYTHON", "nice 'python")
    refused = 'error: GPTPIPE_PYTHON="nice \'python": No closing quotation; give a command as a shell would'
    refused += " take it"
    checkpoints = tmp_path / "checkpoints"
    train = ["train", "--synthetic", "--no-track", "--nproc", "2", "--checkpoint-directory", str(checkpoints)]
    data = tmp_path / "data"
    run = ["run", "--set", "runtime.nproc=2", "--set", f"paths.data_root={data}", "--until", "full"]
    for command in (train, run):
        assert main(command) == 2
        assert capsys.readouterr().err.splitlines() == [refused]
    assert not checkpoints.exists() and not data.exists(), "refused before anything started"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"nproc_per_node": 0}, "--nproc 0"),
        ({"nproc_per_node": 1, "nnodes": 2}, "--nnodes 2: needs --rdzv-endpoint"),
        ({"nproc_per_node": 1, "nnodes": 2, "node_rank": 2, "rdzv_endpoint": "h:1"}, "--node-rank 2"),
        ({"nproc_per_node": 1, "rdzv_endpoint": "nohost"}, "expected HOST:PORT"),
        ({"nproc_per_node": 1, "rdzv_backend": "etcd"}, "--rdzv-backend 'etcd'"),
    ],
)
def test_bad_launch_flags_are_named(fields, message):
    with pytest.raises(ConfigError, match=message):
        LaunchSpec(**fields)


def test_nproc_auto_is_one_on_cpu_and_numbers_pass_through():
    assert resolve_nproc("auto", "cpu") == 1
    assert resolve_nproc(3, "cpu") == 3
    with pytest.raises(ConfigError, match="--nproc 'many'"):
        resolve_nproc("many")


def test_a_rank_killed_by_a_signal_exits_like_a_shell_reports_it():
    assert exit_code_of(-9) == 137
    assert exit_code_of(2) == 2


TREE = textwrap.dedent(
    """
    import subprocess, sys, time
    # like torchrun: a child in a session of its own, so the parent's process group does not hold it
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    print(f"child {child.pid}", flush=True)
    time.sleep(60)
    """
)


def test_cancelling_a_launched_run_stops_the_whole_process_tree():
    cancel = threading.Event()
    children: list[int] = []

    def on_line(line: str) -> None:
        if line.startswith("child "):
            children.append(int(line.split()[1]))
            cancel.set()

    with pytest.raises(LaunchCancelled):
        run_process_tree([sys.executable, "-c", TREE], on_line, cancel=cancel, grace_seconds=5)
    assert children, "the tree never started"
    assert not psutil.pid_exists(children[0]) or psutil.Process(children[0]).status() == psutil.STATUS_ZOMBIE


STUBBORN = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    # a child that refuses SIGTERM, in a session of its own like a torchrun rank
    code = "import signal as s, time; s.signal(s.SIGTERM, s.SIG_IGN); print(1, flush=True); time.sleep(600)"
    child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE)
    child.stdout.readline()  # its handler is in place
    print(f"child {child.pid}", flush=True)
    time.sleep(600)
    """
)


def test_a_second_ctrl_c_kills_at_once_what_refuses_sigterm():
    """The first Ctrl-C asks the tree to stop (SIGTERM, then SIGKILL after the grace period); a second
    one kills what is left at once. A 600 s grace: only the second Ctrl-C can end this test in time."""
    children: list[int] = []

    def on_line(line: str) -> None:
        if line.startswith("child "):
            children.append(int(line.split()[1]))
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, twice
            os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, even where
    try:  # this test runs with SIGINT ignored (a background job of a script inherits it so)
        with pytest.raises(KeyboardInterrupt):  # delivered again to Python's handler once the tree is gone
            run_process_tree([sys.executable, "-c", STUBBORN], on_line, grace_seconds=600)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert children and not _running(children[0])


def test_a_signal_while_the_tree_starts_still_stops_the_tree(monkeypatch: pytest.MonkeyPatch):
    """SIGTERM lands just after the process started, before any line was read: the tree is stopped
    all the same, then the signal reaches the handler that was there before."""
    import gptcore.tools.processes as processes

    started: list[subprocess.Popen] = []
    popen = subprocess.Popen

    def popen_then_signal(*args, **kwargs):
        process = popen(*args, **kwargs)
        started.append(process)
        os.kill(os.getpid(), signal.SIGTERM)  # the most awkward moment
        return process

    seen: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    monkeypatch.setattr(processes.subprocess, "Popen", popen_then_signal)
    try:
        with pytest.raises(LaunchCancelled, match="stopped by SIGTERM"):
            run_process_tree([sys.executable, "-c", "import time; time.sleep(600)"], lambda line: None)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert seen == [signal.SIGTERM] and started[0].returncode is not None


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_launched_runs_exit_code_and_lines_come_back():
    lines: list[str] = []
    code = run_process_tree(
        [sys.executable, "-c", "print('a'); print('b'); raise SystemExit(3)"], lines.append
    )
    assert (code, lines) == (3, ["a", "b"])


class Recorder(TrainingCallback):
    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def on_start(self, startup):
        self.events.append(("start", startup.world_size))

    def on_step(self, record):
        self.events.append(("step", record.step))

    def on_checkpoint(self, path, info):
        self.events.append(("checkpoint", (path.name, info["step"])))

    def on_end(self, summary):
        self.events.append(("end", summary.steps))


def test_json_lines_of_a_launched_run_replay_into_callbacks():
    recorder, text = Recorder(), []
    replay = JsonLinesReplay(recorder, text.append)
    for line in [
        '{"event": "startup", "world_size": 2}',
        "some warning from a rank",
        '{"event": "step", "step": 1, "train_loss": 5.0}',
        '{"event": "checkpoint", "path": "/x/step-00000001.pt", "step": 1, "kind": "step"}',
        '{"event": "summary", "steps": 1}',
    ]:
        replay(line)
    assert recorder.events == [("start", 2), ("step", 1), ("checkpoint", ("step-00000001.pt", 1)), ("end", 1)]
    assert text == ["some warning from a rank"] and replay.summary.steps == 1


def test_a_launched_rank_rebuilds_the_whole_job_a_fine_tunes_start_included(tmp_path: Path) -> None:
    from gptcore.finetune.config import LoRAConfig
    from gptcore.model.config import ModelConfig
    from gptcore.runtime.config import DeviceDefaults, RuntimeConfig
    from gptcore.runtime.device import resolve_runtime
    from gptcore.train.config import TrainingConfig
    from gptcore.train.job import TrainJob
    from gptcore.train.multiprocess import load_job, read_job, save_job

    request = RuntimeConfig(device="cpu", precision="fp32", batch_size=2)
    decided = resolve_runtime(request, lambda _: DeviceDefaults(batch_size=2))
    job = TrainJob(
        model=ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=300),
        runtime=request,
        training=TrainingConfig(max_steps=2),
        train_tokens=None,
        init_weights=tmp_path / "base" / "model.safetensors",
        lora=LoRAConfig(r=4, alpha=8.0, targets=["attn.c_attn"]),
        decided=decided,
    )
    rank = load_job(read_job(save_job(job, tmp_path / "job")), world_size=2, rank=1)
    assert (rank.init_weights, rank.lora) == (job.init_weights, job.lora), (
        "a rank without them trains from scratch"
    )
    assert rank.decided == decided, "every rank trains with the runtime the device stage decided"
    assert (rank.world_size, rank.rank, rank.model, rank.training.max_steps) == (2, 1, job.model, 2)
