"""Contracts with the libraries' private and internal parts the code leans on: each test names the module
that leans, and fails in CI, on the newest release the floors admit, the day the part moves, instead of at
a user's first command. pyproject.toml's floors are the versions the suite runs on (docs/install.md)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch


@pytest.mark.parametrize("adjust_lr_fn", [None, "original", "match_rms_adamw", "unknown"])
@pytest.mark.parametrize("shape", [(64, 32), (32, 64), (48, 48), (3, 200)])
def test_our_muon_rate_per_shape_is_torchs_private_helpers(
    adjust_lr_fn: str | None, shape: tuple[int, int]
) -> None:
    """gptcore.train.muon.adjusted_rate: a copy of torch.optim._muon._adjust_lr, held equal here."""
    from torch.optim._muon import _adjust_lr

    from gptcore.train.muon import adjusted_rate

    size = torch.Size(shape)
    assert adjusted_rate(0.02, adjust_lr_fn, size) == pytest.approx(_adjust_lr(0.02, adjust_lr_fn, size))


def test_torchs_muon_groups_hold_the_settings_our_step_reads() -> None:
    """gptcore.train.muon.Muon subclasses torch.optim.Muon and reads its groups' settings in its step."""
    from gptcore.train.muon import Muon

    group = Muon([torch.nn.Parameter(torch.zeros(4, 4))], lr=0.02).param_groups[0]
    read = {"lr", "momentum", "nesterov", "ns_coefficients", "ns_steps", "eps", "weight_decay"}
    assert read | {"adjust_lr_fn"} <= set(group)
    assert len(group["ns_coefficients"]) == 3


def test_torchs_dispatcher_names_the_attention_kernel() -> None:
    """gptcore.runtime.attention asks torch._fused_sdp_choice which kernel attention runs."""
    from gptcore.model.config import ModelConfig
    from gptcore.runtime.attention import NAMES, attention_backend

    config = ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=300)
    assert attention_backend(config, "cpu", torch.float32) in NAMES.values()


def test_torchs_table_of_fused_kernel_devices() -> None:
    """gptcore.runtime.device.fused_adamw_supported reads torch.utils._foreach_utils' table."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    assert "cuda" in _get_fused_kernels_supported_devices()


def test_torch_compiles_count_their_graphs() -> None:
    """gptcore.train.compile.compiled_graphs reads torch._dynamo.utils.counters."""
    from gptcore.train.compile import compiled_graphs

    before = compiled_graphs()
    double = torch.compile(lambda x: 2 * x, backend="eager")  # dynamo's graph, no compiler needed
    double(torch.ones(3))
    double(torch.ones(3))  # the same shape: the graph built for the first call runs again
    assert compiled_graphs() == before + 1


def test_a_bad_flag_raises_a_usage_error_the_cli_turns_into_one_line() -> None:
    """flows.cli.main catches typer's vendored click's UsageError (typer._click) beside click's."""
    import typer

    from flows.cli.main import USAGE_ERRORS

    app = typer.Typer()

    @app.command()
    def command(count: int = typer.Option(1, "--count")) -> None:
        del count

    with pytest.raises(USAGE_ERRORS):
        app(["--count", "many"], standalone_mode=False)


class _Writer:
    """The parts of tasks.tracking.delivery.writer.RunWriter the system metrics call."""

    def __init__(self, uri: str) -> None:
        self.client = type("Client", (), {"tracking_uri": uri})()
        self.sent: list[tuple[str, dict[str, float], int]] = []
        self.arrived = threading.Event()

    def ask(self, label: str, call: Any, *arguments: Any) -> Any:
        return call(*arguments)

    def log_metrics(self, run: str, metrics: dict[str, float], step: int) -> None:
        self.sent.append((run, metrics, step))
        self.arrived.set()


def test_mlflows_system_metrics_monitor_runs_our_sampling_loop(tmp_path: Path) -> None:
    """tasks.tracking.system_metrics subclasses mlflow's SystemMetricsMonitor and drives its private
    state (_shutdown_event, _logging_step, _metrics_prefix, _process, monitors and their aggregation)."""
    from tasks.tracking.system_metrics import WriterSystemMetrics

    writer = _Writer(f"sqlite:///{tmp_path / 'mlflow.db'}")
    monitor = WriterSystemMetrics(writer, "a-run", sampling_interval=0.01)  # type: ignore[arg-type]
    monitor.start()
    try:
        assert writer.arrived.wait(60), "no sample published in a minute"
    finally:
        monitor.finish()
    run, metrics, step = writer.sent[0]
    assert run == "a-run" and step == 0
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= set(metrics)


def test_mlflows_internal_names_the_tracking_side_reads() -> None:
    """tasks.tracking: tag names from mlflow.utils.mlflow_tags, the error code the pyfunc raises with
    (mlflow.protos.databricks_pb2), and the team server's basic-auth function (flows.servers.team)."""
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT, MLFLOW_MODEL_VERSIONS

    assert isinstance(INVALID_PARAMETER_VALUE, int)
    assert MLFLOW_DATASET_CONTEXT == "mlflow.data.context"
    assert MLFLOW_MODEL_VERSIONS == "mlflow.modelVersions"
    auth = pytest.importorskip("mlflow.server.auth", reason="the team extra (Flask-WTF) is not installed")
    assert callable(auth.authenticate_request_basic_auth)


def test_prefects_server_factory_and_the_settings_of_its_temporary_server() -> None:
    """flows.environment.prefect_settings.TemporaryServer starts Prefect's own app factory with the
    environment Prefect's own temporary server sets (PREFECT__SERVER_EPHEMERAL, PREFECT__SERVER_FINAL)."""
    import inspect

    import prefect.server.api.server as server

    assert callable(server.create_app)
    source = inspect.getsource(server)
    assert '"PREFECT__SERVER_EPHEMERAL"' in source and '"PREFECT__SERVER_FINAL"' in source


def test_mlflows_ui_keeps_the_view_and_the_assistant_under_the_keys_gptpipe_ui_sets() -> None:
    """tasks.tracking.ui sets two of the UI's localStorage keys (its build's names, without the
    `_v1` its storage hook appends) and mounts a page on MLflow's Flask app under its FastAPI app."""
    import flask
    import mlflow.server
    import mlflow.server.fastapi_app

    from tasks.tracking.ui import KEPT

    build = Path(mlflow.server.__file__).parent / "js" / "build" / "static" / "js"
    scripts = "".join(path.read_text(encoding="utf-8", errors="ignore") for path in build.glob("main.*.js"))
    for key in KEPT:
        name = key.removesuffix("_v1")
        assert f'key:"{name}",version:1' in scripts, f"the UI no longer stores {name} (version 1)"
    assert isinstance(mlflow.server.app, flask.Flask)
    assert mlflow.server.fastapi_app.app is not None
