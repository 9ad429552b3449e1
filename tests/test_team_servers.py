"""A team's servers for real: `gptpipe servers --auth` starts PostgreSQL (Debian's, in a temporary folder,
as another user since it refuses root), MLflow's tracking server with its basic-auth app and proxied
artifacts, and Prefect's server with an auth string, both on PostgreSQL. gptpipe reaches them through the
usual variables; without credentials it is refused in one line; its secrets never land in a record."""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import yaml
from fault_support import TINY_PARAMS
from process_support import FORKED_GPTPIPE, STARTED_GPTPIPE, reserved_port
from test_pipeline import gptpipe, states, write_corpus, write_params
from waiting import until

from flows.servers.team import postgres_program
from gptcore.errors import ConfigError
from tasks.params.schema import STAGES

REPO = Path(__file__).resolve().parent.parent
CREDENTIALS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "PREFECT_API_AUTH_STRING")


def _why_not() -> str | None:
    try:
        postgres_program("initdb")
        postgres_program("postgres")
    except ConfigError as error:
        return str(error)
    for module in ("psycopg", "flask_wtf"):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed (pip install '.[team]')"
    return None


pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(_why_not() is not None, reason=_why_not() or ""),
]


@dataclass
class Servers:
    """A running `gptpipe servers --auth` and what it printed."""

    process: subprocess.Popen
    state: Path
    postgres_port: int
    lines: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None  # appends the command's output to `lines` until it ends

    @property
    def client_env(self) -> dict[str, str]:
        pairs = (line.split("=", 1) for line in (self.state / "client.env").read_text().splitlines())
        return dict(pairs)

    @property
    def secrets(self) -> list[str]:
        """Every secret the stack made: the database's and MLflow's passwords, Prefect's auth string."""
        names = ("postgres.password", "mlflow-admin.password", "prefect-auth.secret", "mlflow-flask.secret")
        return [(self.state / name).read_text().strip() for name in names]

    def tree(self) -> list[psutil.Process]:
        return [psutil.Process(self.process.pid), *psutil.Process(self.process.pid).children(recursive=True)]


# What the servers import, planted in the state folder: each leaves its mark if imported, and ends its
# process (MLflow's server starts `python -m uvicorn` itself; uvicorn imports from where it runs).
PLANTED_MODULES = ("uvicorn", "mlflow", "prefect", "fastapi", "starlette")


def plant_modules(state: Path) -> None:
    state.mkdir(mode=0o711)  # traversable: PostgreSQL runs as another user
    for module in PLANTED_MODULES:
        mark = state.parent / f"imported-{module}"
        (state / f"{module}.py").write_text(
            f"import os, pathlib\npathlib.Path({str(mark)!r}).touch()\nos._exit(3)\n"
        )


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    # PostgreSQL runs as another user, who must reach its folder: not under pytest's 0700 temporary root.
    state = Path(tempfile.mkdtemp(prefix="gptpipe-servers-", dir="/tmp"))
    state.chmod(0o711)
    plant_modules(state / "s")
    held = contextlib.ExitStack()  # the three ports stay the test's until the servers are gone
    ports = [str(held.enter_context(reserved_port())) for _ in range(3)]
    # Started afresh: the servers' process tree is under test.
    command = [*STARTED_GPTPIPE, "servers", "--state", str(state / "s"), "--auth", "--workers", "2"]
    command += ["--mlflow-port", ports[0], "--prefect-port", ports[1], "--postgres-port", ports[2]]
    env = {name: value for name, value in os.environ.items() if not name.startswith(("MLFLOW_", "PREFECT_"))}
    process = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    running = Servers(process, state / "s", int(ports[2]))
    ready: queue.Queue = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            running.lines.append(line.rstrip("\n"))
            if line.startswith("servers ready"):
                ready.put(True)
        ready.put(False)

    running.reader = threading.Thread(target=read, daemon=True)
    running.reader.start()
    try:
        assert ready.get(timeout=180), "\n".join(running.lines[-30:])
        yield running
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        held.close()
        shutil.rmtree(state, ignore_errors=True)


def client(servers: Servers, without: tuple[str, ...] = (), **changes: str) -> dict[str, str]:
    """A client's environment: the stack's client.env, less `without`, plus `changes`."""
    env = {name: value for name, value in os.environ.items() if not name.startswith(("MLFLOW_", "PREFECT_"))}
    env.update(servers.client_env)
    for name in without:
        env.pop(name, None)
    env.update(changes)
    return env


def tiny_params(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump({**TINY_PARAMS, "tracking": {"experiment": "team"}}))
    return path


def train(env: dict[str, str], folder: Path) -> subprocess.CompletedProcess[str]:
    command = [*FORKED_GPTPIPE, "train", "--params", str(tiny_params(folder)), "--synthetic"]
    command += ["--device", "cpu"]
    command += [
        "--max-steps",
        "6",
        "--log-every",
        "1",
        "--eval-every",
        "3",
        "--checkpoint-directory",
        str(folder),
    ]
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=300)


def test_without_credentials_a_training_is_refused_in_one_line_before_it_starts(
    servers: Servers, tmp_path: Path
) -> None:
    refused = train(client(servers, without=CREDENTIALS), tmp_path / "anonymous")
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        f"error: tracking server {servers.client_env['MLFLOW_TRACKING_URI']} asks for credentials: "
        "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"
    ]
    assert refused.stdout == ""  # refused before the startup line: nothing trained
    wrong = train(client(servers, MLFLOW_TRACKING_PASSWORD="not-the-password"), tmp_path / "wrong")
    assert wrong.returncode == 1
    assert (
        wrong.stderr.strip()
        .splitlines()[-1]
        .endswith("refused the credentials of user 'admin': check MLFLOW_TRACKING_PASSWORD")
    )


def test_with_credentials_a_training_is_recorded_on_postgresql_and_no_secret_lands_anywhere(
    servers: Servers, tmp_path: Path
) -> None:
    from mlflow import MlflowClient

    env = client(servers)
    result = train(env, tmp_path / "run")
    assert result.returncode == 0, result.stderr[-2000:]
    os.environ.update({name: env[name] for name in CREDENTIALS[:2]})  # this process's client reads them
    try:
        mlflow = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
        experiment = mlflow.get_experiment_by_name("team")
        (run,) = mlflow.search_runs([experiment.experiment_id])
        history = mlflow.get_metric_history(run.info.run_id, "train_loss")
        artifacts = [item.path for item in mlflow.list_artifacts(run.info.run_id)]
    finally:
        for name in CREDENTIALS[:2]:
            os.environ.pop(name, None)
    assert run.info.status == "FINISHED" and run.data.params["device"] == "cpu"
    assert [metric.step for metric in history] == [1, 2, 3, 4, 5, 6]
    # Artifacts go through the server to its --artifacts-destination: the client never saw the folder.
    assert experiment.artifact_location.startswith("mlflow-artifacts:")
    stored = [path for path in (servers.state / "artifacts").rglob("*") if path.is_file()]
    assert artifacts and stored
    # The records are in PostgreSQL (MLflow's database there), not in a file store.
    assert servers_rows(servers, "mlflow", "SELECT count(*) FROM runs") >= 1

    records = [result.stdout, result.stderr, str(run.data.params), str(run.data.tags)]
    records += [path.read_bytes().decode("utf-8", "replace") for path in stored]
    records += [path.read_bytes().decode("utf-8", "replace") for path in (tmp_path / "run").rglob("*.json*")]
    for secret in servers.secrets:
        assert not any(secret in record for record in records)


def servers_rows(servers: Servers, database: str, query: str) -> int:
    import psycopg

    password = (servers.state / "postgres.password").read_text().strip()
    with psycopg.connect(
        host="127.0.0.1", port=servers.postgres_port, user="gptpipe", password=password, dbname=database
    ) as connection:
        return connection.execute(query).fetchone()[0]


def test_prefect_without_its_auth_string_is_refused_in_one_line(servers: Servers, tmp_path: Path) -> None:
    write_corpus(tmp_path)
    params = write_params(tmp_path)
    for env, expected in (
        (
            client(servers, without=("PREFECT_API_AUTH_STRING",)),
            "asks for credentials: set PREFECT_API_AUTH_STRING",
        ),
        (client(servers, PREFECT_API_AUTH_STRING="admin:wrong"), "refused PREFECT_API_AUTH_STRING"),
    ):
        result = subprocess.run(
            [*FORKED_GPTPIPE, "run", "--params", str(params)], cwd=tmp_path, env=env, capture_output=True,
            text=True,
            timeout=120,
        )  # fmt: skip
        assert result.returncode != 0
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("error: ") and expected in line and "Traceback" not in result.stderr


def test_the_whole_pipeline_runs_on_the_team_servers(servers: Servers, tmp_path: Path) -> None:
    write_corpus(tmp_path)
    params = write_params(tmp_path)
    home = tmp_path / "prefect"  # the client's own: its result storage too, so no cache crosses tests
    env = client(
        servers, PREFECT_HOME=str(home), PREFECT_RESULTS_LOCAL_STORAGE_PATH=str(home / "storage"),
        PREFECT_LOGGING_LEVEL="WARNING",
    )  # fmt: skip
    # A process of its own: the servers' credentials reach it by its environment alone.
    result = gptpipe(env, "--params", str(params), "--until", "evaluate", process=True)
    ran = STAGES[: STAGES.index("evaluate") + 1]
    assert {stage: state for stage, state in states(result).items() if stage in ran} == dict.fromkeys(
        ran, "completed"
    )
    completed = "SELECT count(*) FROM flow_run WHERE state_type = 'COMPLETED'"
    assert servers_rows(servers, "prefect", completed) >= 1
    assert servers_rows(servers, "mlflow", "SELECT count(*) FROM model_versions") >= 1
    for secret in servers.secrets:
        assert secret not in result.stdout + result.stderr


def test_no_module_planted_in_the_state_folder_ran_and_every_server_process_runs_in_its_own_folder(
    servers: Servers,
) -> None:
    assert sorted(path.name for path in servers.state.parent.glob("imported-*")) == []
    assert list((servers.state / "work").iterdir()) == []  # nothing wrote there: the next start takes it
    members = python_processes(servers)
    assert len(members) >= 3  # mlflow, its uvicorn, prefect
    assert set(members) == {(str(servers.state / "work"), "1")}


def python_processes(servers: Servers) -> list[tuple[str, str | None]]:
    """Where each Python process under the servers runs, and its PYTHONSAFEPATH; one that ends while it
    is read (a zombie has no command line) is passed over."""
    found = []
    for member in servers.tree()[1:]:
        with contextlib.suppress(psutil.Error):
            if member.cmdline()[:1] == [sys.executable]:
                found.append((member.cwd(), member.environ().get("PYTHONSAFEPATH")))
    return found


def test_sigterm_stops_the_servers_then_postgresql_and_leaves_nothing_running(servers: Servers) -> None:
    tree = servers.tree()
    assert len(tree) >= 4  # gptpipe, postgres (and its workers), mlflow, prefect
    servers.process.send_signal(signal.SIGTERM)
    servers.process.wait(timeout=90)

    def gone(member: psutil.Process) -> bool:
        try:
            return not member.is_running() or member.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            return True

    until(lambda: all(gone(member) for member in tree), "every process of the servers' tree ended")
    servers.reader.join(timeout=10)  # the output's last lines, read after the process ended
    output = "\n".join(servers.lines)
    assert "database system is shut down" in output
    # The servers went before the database under them: no server logged a lost connection.
    assert output.rindex("mlflow ") < output.index("received smart shutdown request")
    for secret in servers.secrets:
        assert secret not in output
