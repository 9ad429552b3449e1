"""A sweep's trials: grids, seeded random search over log-uniform ranges, and every trial validated first."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from process_support import Lines
from slot_support import holding_the_device

from gptcore.errors import ConfigError
from tasks.device_slot import device_limit_names
from tasks.params.loading import load_params
from tasks.params.schema import SweepConfig
from tasks.params.sweep import expand, parse_grid, validate_trials

REPO = Path(__file__).resolve().parent.parent
ITERATION_1 = REPO / "params" / "iteration_1.yaml"


def test_a_grid_is_every_combination_of_the_values_each_as_set_would_apply_it() -> None:
    grid = parse_grid(["full.optimizer.learning_rate=1e-3,2e-3", "runtime.batch_size=4,8"])
    trials = expand(SweepConfig(grid=grid))
    assert [trial.name for trial in trials] == ["trial-01", "trial-02", "trial-03", "trial-04"]
    assert [trial.values for trial in trials] == [
        {"full.optimizer.learning_rate": 0.001, "runtime.batch_size": 4},
        {"full.optimizer.learning_rate": 0.001, "runtime.batch_size": 8},
        {"full.optimizer.learning_rate": 0.002, "runtime.batch_size": 4},
        {"full.optimizer.learning_rate": 0.002, "runtime.batch_size": 8},
    ]
    params = validate_trials(ITERATION_1, [], trials)
    assert [(p.full.optimizer.learning_rate, p.runtime.batch_size) for p in params] == [
        (0.001, 4),
        (0.001, 8),
        (0.002, 4),
        (0.002, 8),
    ]


def test_a_grid_over_the_recipe_is_the_model_profile_by_the_optimizer() -> None:
    """`--grid model=...` names whole profiles (each resolved as the parameter file's own would be), so a
    sweep compares recipes, and with `full.optimizer.name` every architecture meets both optimizers."""
    grid = parse_grid(["model=gpt_first_cpu,gpt_first_cpu_modern", "full.optimizer.name=adamw,muon"])
    params = validate_trials(ITERATION_1, [], expand(SweepConfig(grid=grid)))
    recipes = [(p.model.as_params()["model.recipe"], p.optimizer_params()["optimizer.name"]) for p in params]
    modern = "rotary+rmsnorm+qk_norm+swiglu"
    assert recipes == [("gpt2", "adamw"), ("gpt2", "muon"), (modern, "adamw"), (modern, "muon")]
    assert "optimizer.muon_learning_rate" not in params[0].optimizer_params()  # AdamW's: as before Muon
    assert params[1].smoke.optimizer is None  # the smoke run proves the full section's optimizer


def test_random_search_draws_log_uniformly_from_ranges_and_repeats_with_its_seed() -> None:
    config = SweepConfig(
        grid=parse_grid(["full.optimizer.learning_rate=1e-4..1e-2", "runtime.batch_size=4,8"])
    )
    drawn = expand(config.model_copy(update={"random": 40, "seed": 7}))
    rates = [trial.values["full.optimizer.learning_rate"] for trial in drawn]
    assert len(drawn) == 40 and all(1e-4 <= rate <= 1e-2 for rate in rates)
    assert sum(rate < 1e-3 for rate in rates) >= 10  # log-uniform: about half below the geometric middle
    assert {trial.values["runtime.batch_size"] for trial in drawn} == {4, 8}
    assert expand(config.model_copy(update={"random": 40, "seed": 7})) == drawn
    assert expand(config.model_copy(update={"random": 40, "seed": 8})) != drawn


def test_a_range_needs_random_search_and_a_bad_trial_is_named_before_anything_runs() -> None:
    with pytest.raises(ConfigError, match=r"sweep.grid.full.optimizer.learning_rate '1e-4..1e-2': a range"):
        expand(SweepConfig(grid=parse_grid(["full.optimizer.learning_rate=1e-4..1e-2"])))
    trials = expand(SweepConfig(grid=parse_grid(["runtime.batch_size=4,0"])))
    with pytest.raises(ConfigError) as error:
        validate_trials(ITERATION_1, [], trials)
    message = str(error.value)
    assert message.startswith("sweep trial-02 (runtime.batch_size=0): ") and "runtime.batch_size" in message
    assert "\n" not in message
    with pytest.raises(ConfigError, match=r"--grid 'runtime.batch_size': expected key.path=a,b,c"):
        parse_grid(["runtime.batch_size"])


def test_a_parameter_file_can_hold_its_sweep(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    section = """
sweep:
  grid:
    full.optimizer.learning_rate: 1e-4..1e-2
  random: 3
  seed: 1
  parallel: 2
"""
    path.write_text(ITERATION_1.read_text() + section)
    (tmp_path / "profiles").symlink_to(REPO / "params" / "profiles")
    sweep = load_params(path).sweep
    assert (sweep.random, sweep.seed, sweep.parallel) == (3, 1, 2)
    assert len(expand(sweep)) == 3


def test_a_trial_runs_the_program_gptpipe_trial_program_names_else_the_installed_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    from flows.trials import gptpipe_program

    monkeypatch.setenv("GPTPIPE_TRIAL_PROGRAM", "nice -n 10 '/opt/my tools/gptpipe'")
    assert gptpipe_program() == ["nice", "-n", "10", "/opt/my tools/gptpipe"]
    monkeypatch.setenv("GPTPIPE_TRIAL_PROGRAM", "nice 'gptpipe")
    with pytest.raises(ConfigError, match=r"^GPTPIPE_TRIAL_PROGRAM=\"nice 'gptpipe\": No closing quotation"):
        gptpipe_program()
    monkeypatch.delenv("GPTPIPE_TRIAL_PROGRAM")
    assert gptpipe_program() == [str(Path(sys.executable).with_name("gptpipe"))]  # this venv's


LEARNING_RATES = ["--grid", "full.optimizer.learning_rate=1e-3,3e-3"]
# Three trials, two at a time: the third waits for a free place, and for the device.
BATCH_SIZES = ["--grid", "full.optimizer.learning_rate=3e-3", "--grid", "runtime.batch_size=2,4,8"]


SWEEP_CEILING = 600  # against a hang only; the test's own timeout is above it, so a hang says where it was


def sweep(
    tmp_path: Path,
    env: dict[str, str],
    grid: list[str],
    *options: str,
    meanwhile: Callable[[Lines], None] = lambda _: None,
) -> tuple[Any, dict[str, Any]]:
    """`gptpipe sweep` of tiny trials over `grid` (--grid options) on a tiny corpus: the finished command
    and its summary, every trial checked completed with a test figure. `meanwhile` acts while the sweep
    runs, on its error output as it comes."""
    import json
    import subprocess

    from test_pipeline import GPTPIPE, write_corpus, write_params

    write_corpus(tmp_path, seed=4)
    params = str(write_params(tmp_path, full_steps=4))
    command = [*GPTPIPE, "sweep", "--params", params, *grid, *options]
    with (tmp_path / "sweep.out").open("w+") as out:
        process = subprocess.Popen(command, env=env, cwd=REPO, stdout=out, stderr=subprocess.PIPE, text=True)
        errors = Lines(process.stderr)
        try:
            meanwhile(errors)
            process.wait(timeout=SWEEP_CEILING)
        finally:
            process.kill()  # nothing left to end where it finished
        out.seek(0)
        done = subprocess.CompletedProcess(command, process.returncode, out.read(), errors.text())
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    trials = math.prod(len(values.split("=")[1].split(",")) for values in grid[1::2])
    assert [trial["state"] for trial in summary["trials"]] == ["completed"] * trials
    assert all(trial["test_bits_per_byte"] > 0 for trial in summary["trials"])
    return done, summary


def waiting_trials(lines: list[str]) -> set[str]:
    """The trials that said they wait for the CPU's slot."""
    waited = f"waiting for {device_limit_names('cpu')[0]}"
    return {line.split("]")[0].lstrip("[") for line in lines if line.startswith("[trial-") and waited in line}


@pytest.mark.integration
@pytest.mark.slow(seconds=45)
@pytest.mark.timeout(SWEEP_CEILING + 60)
def test_a_sweep_builds_the_data_once_and_trains_one_trial_at_a_time_on_one_device(
    tmp_path: Path, prefect_env: dict[str, str]
) -> None:
    from mlflow import MlflowClient

    def two_trials_meet_at_the_device(errors: Lines) -> None:
        with holding_the_device("cpu", prefect_env):  # until both running trials wait for it
            errors.wait_for(lambda lines: len(waiting_trials(lines)) == 2)

    done, summary = sweep(
        tmp_path, prefect_env, BATCH_SIZES, "--parallel", "2", meanwhile=two_trials_meet_at_the_device
    )
    assert "| trial-03 | full.optimizer.learning_rate=0.003 runtime.batch_size=8 |" in done.stderr

    client = MlflowClient(prefect_env["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("test-pipeline").experiment_id
    children = client.search_runs([experiment], f"tags.mlflow.parentRunId = '{summary['sweep_run_id']}'")
    named = sorted(run.data.tags["mlflow.runName"].split("-iteration")[0] for run in children)
    assert named == ["data", "trial-01", "trial-02", "trial-03"]
    trial_runs = [run for run in children if run.data.tags["kind"] == "trial"]
    assert {run.data.params["sweep.runtime.batch_size"] for run in trial_runs} == {"2", "4", "8"}
    assert all("test_bits_per_byte" in run.data.metrics for run in trial_runs)
    built = client.search_runs([experiment], "tags.stage = 'tokens' and tags.cached = 'false'")
    assert len(built) == 1  # the data stages ran once; every trial took them from the cache

    # Two trials at once, one device: no two trainings overlap (their step metrics' timestamps show it).
    trainings = client.search_runs([experiment], "tags.kind = 'training'")
    spans = sorted(
        (min(m.timestamp for m in history), max(m.timestamp for m in history))
        for history in (client.get_metric_history(run.info.run_id, "train_loss") for run in trainings)
        if history
    )
    assert len(spans) == 6  # a smoke and a full training per trial
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans))
    assert "| ERROR" not in done.stderr, "a trial waits for the device quietly (no Prefect lease ERROR)"
