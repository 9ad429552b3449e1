"""Many writers at once: trainings and a sweep against a team's servers on PostgreSQL, and the same
trainings against the SQLite default.

    .venv/bin/python bench/team_load.py                     # 8 trainings, a sweep of 8 trials on 2 workers
    .venv/bin/python bench/team_load.py --trainings 4 --steps 30 --trials 0

Each training is a real `gptpipe train` of a tiny model on real text (this interpreter's standard
library), a metric record every step (`--log-every 1`), its best and final checkpoints logged as models;
all start at once. For every store it prints the runs, the metric values expected and delivered (every
step of every per-step metric, read back from the store), those missing or out of order, the logged
models, the wall seconds, and each failure's last line. The sweep's trials run on a process work pool
with two workers, each its own machine (`GPTPIPE_MACHINE`), so two trials train at once; each trial
registers its model: the registry's versions are counted. PostgreSQL, MLflow and Prefect are started by
`gptpipe servers --auth` in a temporary folder. Needs Debian's postgresql package and the `team` extra.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GPTPIPE = [sys.executable, "-m", "flows.cli.main"]
PREFECT = [sys.executable, "-m", "prefect"]
STEP_METRICS = ("train_loss", "learning_rate", "grad_norm", "tokens_per_second", "steps_per_second", "mfu")
PROFILE = """\
name: load
architecture: {n_layer: 2, n_head: 2, n_embd: 64, block_size: 64, vocab_size: 512}
cpu: {batch_size: 8, grad_accum_steps: 1, precision: fp32, workers: 0}
gpu: {batch_size: 8, grad_accum_steps: 1, precision: fp32, workers: 0}
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def write_inputs(root: Path, steps: int) -> Path:
    """A corpus of real text (40 standard-library modules) and a parameter file for the tiny model."""
    corpus = root / "corpus"
    corpus.mkdir(parents=True)
    sources = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    for source in random.Random(0).sample(sources, 40):
        shutil.copy(source, corpus / f"{source.stem}.txt")
    (root / "profiles").mkdir()
    (root / "profiles" / "load.yaml").write_text(PROFILE)
    params = root / "params.yaml"
    params.write_text(
        f"iteration: 1\nmodel: load\n"
        f"corpus: {{source: local, paths: ['{corpus}'], validation_fraction: 0.1, test_fraction: 0.05}}\n"
        "tokenizer: {vocab_size: 512}\nruntime: {device: cpu}\n"
        "smoke: {max_steps: 4, log_every: 2, eval_every: 4, validation_examples: 8}\n"
        f"full: {{max_steps: {steps}, log_every: 1, eval_every: {steps // 2}, checkpoint_every: {steps // 2},"
        " validation_examples: 16}\n"
        "export: {hf: false}\nquantize: {methods: [bf16], new_tokens: 4, repeats: 1, max_test_tokens: 2048}\n"
        f"tracking: {{experiment: load}}\npaths: {{data_root: '{root / 'data'}', "
        f"checkpoint_root: '{root / 'checkpoints'}'}}\n"
    )
    return params


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_", "GPTPIPE_"))}
    # One thread a training: eight at once on a few cores would otherwise fight over them.
    quiet = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return {**env, **quiet, **extra}


def build_tokens(root: Path, params: Path) -> list[str]:
    """The token files and tokenizer, built once by the pipeline's own data stages."""
    env = clean_env(
        MLFLOW_TRACKING_URI=f"sqlite:///{root / 'build' / 'mlflow.db'}", PREFECT_HOME=str(root / "p")
    )
    done = subprocess.run([*GPTPIPE, "run", "--params", str(params), "--until", "tokens"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"building the token files failed: {done.stderr.strip().splitlines()[-1:]}")
    (train,) = (root / "data").rglob("train.bin")
    folder = train.parent
    return ["--train-tokens", str(train), "--validation-tokens", str(folder / "validation.bin"),
            "--tokenizer", str(next((root / "data").rglob("tokenizer.json")))]  # fmt: skip


def trainings(root: Path, params: Path, data: list[str], env: dict[str, str], count: int, label: str) -> dict:
    """`count` trainings started at once; what each did."""
    processes = []
    started = time.monotonic()
    for index in range(count):
        folder = root / label / f"run-{index}"
        folder.mkdir(parents=True)
        command = [*GPTPIPE, "train", "--params", str(params), *data, "--checkpoint-directory", str(folder)]
        command += ["--set", f"tracking.experiment=load-{label}", "--json"]
        log = open(folder / "log.txt", "w")  # noqa: SIM115  (closed below)
        processes.append(
            (subprocess.Popen(command, env=env, cwd=folder, stdout=log, stderr=subprocess.STDOUT), log)
        )
    failures = []
    for process, log in processes:
        code = process.wait(timeout=1800)
        log.close()
        if code != 0:
            failures.append(Path(log.name).read_text().strip().splitlines()[-1:])
    seconds = time.monotonic() - started
    return {"seconds": seconds, "failures": failures, **replay_outboxes(root / label, env)}


def replay_outboxes(folder: Path, env: dict[str, str]) -> dict:
    """What the runs left in outboxes (their writer gave up waiting for the store), sent with `gptpipe
    tracking replay` as a user would: records spilled, records replayed, replay seconds."""
    outboxes = sorted(folder.rglob("outbox/*.jsonl"))
    spilled = sum(len(path.read_text().splitlines()) for path in outboxes)
    started, replayed = time.monotonic(), 0
    for outbox in outboxes:
        done = subprocess.run([*GPTPIPE, "tracking", "replay", str(outbox)], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        if done.returncode == 0 and "sent " in done.stdout:
            replayed += int(done.stdout.split("sent ")[1].split(" records")[0])
    return {"outboxes": len(outboxes), "spilled_records": spilled, "replayed_records": replayed,
            "replay_seconds": time.monotonic() - started}  # fmt: skip


def delivered(env: dict[str, str], experiment: str, steps: int) -> dict:
    """What the store holds of an experiment's runs: every per-step metric read back."""
    os.environ.update({k: v for k, v in env.items() if k.startswith("MLFLOW_")})
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id]) if found else []
    expected = delivered_values = missing = disorder = 0
    for run in runs:
        for name in STEP_METRICS:
            history = client.get_metric_history(run.info.run_id, name)
            got = [metric.step for metric in history]
            expected += steps
            delivered_values += len(set(got) & set(range(1, steps + 1)))
            missing += len(set(range(1, steps + 1)) - set(got))
            disorder += got != sorted(got)
    models = client.search_logged_models(experiment_ids=[found.experiment_id]) if found else []
    finished = sum(run.info.status == "FINISHED" for run in runs)
    return {"runs": len(runs), "finished": finished, "expected": expected, "delivered": delivered_values,
            "missing": missing, "out_of_order_series": disorder, "logged_models": len(models)}  # fmt: skip


def start_servers(root: Path) -> tuple[subprocess.Popen, dict[str, str]]:
    state = root / "servers"
    ports = [str(free_port()) for _ in range(3)]
    command = [*GPTPIPE, "servers", "--state", str(state), "--auth", "--workers", "4"]
    command += ["--mlflow-port", ports[0], "--prefect-port", ports[1], "--postgres-port", ports[2]]
    log = open(root / "servers.log", "w")  # noqa: SIM115  (the servers' for their lifetime)
    process = subprocess.Popen(command, env=clean_env(), cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 180
    while "servers ready" not in (root / "servers.log").read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"gptpipe servers did not start: see {root / 'servers.log'}")
        time.sleep(0.5)
    pairs = (line.split("=", 1) for line in (state / "client.env").read_text().splitlines())
    return process, dict(pairs)


def sweep(root: Path, params: Path, env: dict[str, str], trials: int, workers: int) -> dict:
    """A sweep of `trials` trials on a process work pool served by `workers` workers (one machine each)."""
    env = {**env, "PREFECT_HOME": str(root / "sweep-prefect"), "PREFECT_WORKER_QUERY_SECONDS": "1"}
    subprocess.run([*PREFECT, "work-pool", "create", "load", "--type", "process"], env=env, check=True,
                   capture_output=True)  # fmt: skip
    pool = []
    for index in range(workers):
        worker_env = {**env, "GPTPIPE_MACHINE": f"worker-{index}"}
        log = open(root / f"worker-{index}.log", "w")  # noqa: SIM115  (the worker's for its lifetime)
        command = [*PREFECT, "worker", "start", "--pool", "load", "--limit", "1"]
        pool.append(subprocess.Popen(command, env=worker_env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True))  # fmt: skip
    rates = ",".join(f"{1e-3 * (index + 1):.0e}" for index in range(trials))
    started = time.monotonic()
    try:
        done = subprocess.run([*GPTPIPE, "sweep", "--params", str(params), "--grid",
                               f"full.optimizer.learning_rate={rates}", "--work-pool", "load"],
                              env=env, cwd=REPO, capture_output=True, text=True, timeout=3600)  # fmt: skip
    finally:
        for worker in pool:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=60)
    seconds = time.monotonic() - started
    summary = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {}
    os.environ.update({k: v for k, v in env.items() if k.startswith("MLFLOW_")})
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    versions = client.search_model_versions("name = 'gptpipe-iteration-1'")
    return {"exit": done.returncode, "seconds": seconds, "failed": summary.get("failed"),
            "registry_versions": len(versions), "error": done.stderr.strip().splitlines()[-1:]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trainings", type=int, default=8)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gptpipe-load-", dir="/tmp"))
    root.chmod(0o711)  # PostgreSQL runs as another user when this is root: it must reach its folder
    print(f"== team_load: {args.trainings} trainings of {args.steps} steps, {args.trials} trials on "
          f"{args.workers} workers; {os.cpu_count()} cores; folder {root}", flush=True)  # fmt: skip
    servers = None
    try:
        params = write_inputs(root, args.steps)
        data = build_tokens(root, params)
        servers, client_env = start_servers(root)
        team = clean_env(**client_env)
        done = trainings(root, params, data, team, args.trainings, "postgresql")
        print(
            f"postgresql: {json.dumps({**done, **delivered(team, 'load-postgresql', args.steps)})}",
            flush=True,
        )
        if args.trials:
            print(f"sweep: {json.dumps(sweep(root, params, team, args.trials, args.workers))}", flush=True)
        sqlite = clean_env(MLFLOW_TRACKING_URI=f"sqlite:///{root / 'sqlite' / 'mlflow.db'}")
        (root / "sqlite").mkdir()
        done = trainings(root, params, data, sqlite, args.trainings, "sqlite")
        print(f"sqlite: {json.dumps({**done, **delivered(sqlite, 'load-sqlite', args.steps)})}", flush=True)
    finally:
        if servers is not None:
            os.killpg(servers.pid, signal.SIGTERM)
            servers.wait(timeout=120)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
