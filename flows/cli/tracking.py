"""`gptpipe ui` (the MLflow UI over the tracking store) and `gptpipe compare` (the bounded comparison)."""

from __future__ import annotations

import ipaddress
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from flows.cli.options import resolve_params
from flows.servers.team import server_environment
from gptcore.errors import ConfigError
from gptcore.runtime.config import ConcretePrecision
from tasks.params.loading import choice
from tasks.params.schema import PipelineParams

if TYPE_CHECKING:
    from gptcore.eval.comparison import Limits
    from tasks.tracking.delivery.outbox import Outbox
    from tasks.tracking.store import TrackingTarget


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def server_command(target: TrackingTarget, host: str = "127.0.0.1", port: int = 5000) -> list[str]:
    """`mlflow server` over a local store: its database, and artifacts served from the store's root."""
    artifacts = target.artifact_location or Path("mlruns/artifacts").resolve().as_uri()
    return [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", target.uri,
        "--default-artifact-root", artifacts,
        "--host", host, "--port", str(port),
        "--workers", "1",
        "--app-name", "gptpipe-ui",  # MLflow's app and the training-view page (tasks.tracking.ui)
    ]  # fmt: skip


def ui_command(
    params_file: Path | None = typer.Option(None, "--params", help="parameter file naming the store"),
    iteration: int | None = typer.Option(None, "--iteration", min=1),
    host: str = typer.Option("127.0.0.1", "--host", help="address to bind; loopback unless you ask"),
    port: int = typer.Option(5000, "--port", min=1, max=65535),
    jobs: bool = typer.Option(False, "--jobs", help="also start MLflow's job runner (its GenAI jobs)"),
    open_: bool = typer.Option(False, "--open", help="open the runs page in a browser once it answers"),
) -> None:
    """Start the MLflow UI (`mlflow server`) over the tracking store and print the URL of the iteration's
    experiment's runs table."""
    from tasks.tracking.store import redact, resolve_target

    _, params = resolve_params(params_file, iteration, [])
    target = resolve_target(params.tracking)
    if not target.is_local:
        print(f"the tracking store is a server already: open {redact(target.uri)}")
        return
    if not is_loopback(host):
        print(f"warning: --host {host}: the MLflow UI will be reachable from other machines", file=sys.stderr)
    shown = f"[{host}]" if ":" in host else host
    base = f"http://{shown}:{port}"
    page = runs_page(target, params.tracking.experiment, base)
    print(f"MLflow UI: {page}  (store {target.uri}; Ctrl-C stops it)", flush=True)
    if open_:
        open_when_answering(base, page)
    from gptcore.tools.processes import run_process_tree

    try:  # Ctrl-C and SIGTERM stop the server and its workers, the whole tree
        command = server_command(target, host, port)
        code = run_process_tree(command, lambda line: print(line, flush=True), env=server_environment(jobs))
    except KeyboardInterrupt:
        return
    if code not in (0, -2, -15, 130, 143):
        raise ConfigError(f"mlflow server exited with status {code} (is port {port} in use? try --port)")


def runs_page(target: TrackingTarget, experiment: str, base: str) -> str:
    """The runs table of `experiment` in the UI at `base` over a local store, shown as model training;
    the UI's home page while the store has no such experiment (nothing recorded yet)."""
    from tasks.tracking.ui import training_view_url

    if target.database is None or not target.database.exists():
        return training_view_url(base)  # no store yet: opening it here would create it
    from tasks.tracking.store import experiment_id_named

    found = experiment_id_named(target, experiment)  # None from a store that cannot be read: the UI says why
    if found is None:
        return training_view_url(base)
    return training_view_url(base, f"/experiments/{found}/runs")


def open_when_answering(base: str, page: str, seconds: float = 120.0) -> None:
    """Open `page` in the default browser once the server at `base` answers its health check, from a
    thread, so the server's output goes on meanwhile."""
    import threading
    import time
    import urllib.request
    import webbrowser

    def wait_then_open() -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2):
                    webbrowser.open(page)
                    return
            except OSError:
                time.sleep(0.5)

    threading.Thread(target=wait_then_open, name="gptpipe-ui-open", daemon=True).start()


def compare_command(
    params_file: Path | None = typer.Option(None, "--params", help="a parameter file"),
    iteration: int | None = typer.Option(None, "--iteration", min=1),
    set_: list[str] = typer.Option([], "--set", help="override a parameter: key.path=value"),
    axis: str = typer.Option(
        "auto", "--axis", help="auto (CPU vs CUDA, else precision), device, precision, batch_size"
    ),
    values: str | None = typer.Option(None, "--values", help="the two values compared, comma-separated"),
    max_steps: int = typer.Option(10, "--max-steps", min=1),
    training_examples: int = typer.Option(64, "--training-examples", min=1),
    validation_examples: int = typer.Option(16, "--validation-examples", min=1),
    batch_size: int | None = typer.Option(None, "--batch-size", min=1),
    precision: str | None = typer.Option(None, "--precision", help="fp32, bf16 or fp16 (both sides)"),
    train_tokens: Path | None = typer.Option(None, "--train-tokens", help="default: a synthetic stream"),
    validation_tokens: Path | None = typer.Option(None, "--validation-tokens"),
    tokenizer: Path | None = typer.Option(None, "--tokenizer"),
    runs: str | None = typer.Option(
        None, "--runs", help="compare two recorded runs: RUN_A,RUN_B (no training)"
    ),
    no_track: bool = typer.Option(
        False, "--no-track", help="train and compare in this process: no MLflow record, no Prefect flow"
    ),
) -> None:
    """Two bounded training runs that differ in one axis, recorded in MLflow; prints the comparison."""
    path, params = resolve_params(params_file, iteration, list(set_))
    chosen = [v.strip() for v in values.split(",")] if values else None
    if precision is not None:
        choice("--precision", precision, ConcretePrecision)
    if train_tokens is not None and not train_tokens.is_file():
        raise ConfigError(f"--train-tokens {train_tokens}: file not found")
    from gptcore.eval.comparison import AXES, Limits

    choice("--axis", axis, ("auto", *AXES))
    if runs is not None and no_track:
        raise ConfigError("--runs reads recorded runs from MLflow; --no-track records none: give one of them")
    limits = Limits(max_steps, training_examples, validation_examples)
    sources = (train_tokens, validation_tokens, tokenizer)
    if runs is not None:
        _compare_recorded(params, runs, axis)
    elif no_track:
        _compare_in_memory(params, axis, chosen, limits, batch_size, precision, sources)
    else:
        _compare_in_a_flow(path, list(set_), axis, chosen, limits, batch_size, precision, sources)


def _compare_recorded(params: PipelineParams, runs: str, axis: str) -> None:
    """Two runs already in MLflow, compared without training."""
    from flows.compare import compare_runs
    from gptcore.eval.comparison import print_comparison
    from tasks.tracking import TrackingSession

    ids = [r.strip() for r in runs.split(",") if r.strip()]
    if len(ids) != 2:
        raise ConfigError(f"--runs {runs!r}: expected two run ids, comma-separated")
    if axis == "auto":
        raise ConfigError("--runs: name the compared --axis (device, precision or batch_size)")
    print_comparison(compare_runs(TrackingSession.open(params.tracking), ids, axis))


def _compare_in_memory(
    params: PipelineParams, axis: str, chosen: list[str] | None, limits: Limits, batch_size: int | None,
    precision: str | None, sources: tuple[Path | None, Path | None, Path | None],
) -> None:  # fmt: skip
    """Both sides trained in this process; nothing recorded (`--no-track`)."""
    import torch

    from gptcore.eval.comparison import print_comparison
    from tasks.comparison import compare_in_memory, plan_comparison

    plan = plan_comparison(
        params, axis, chosen, limits, torch.cuda.is_available(), batch_size, precision, *sources
    )
    print_comparison(compare_in_memory(params, plan, sources[2]))


def _compare_in_a_flow(
    path: Path, overrides: list[str], axis: str, chosen: list[str] | None, limits: Limits,
    batch_size: int | None, precision: str | None, sources: tuple[Path | None, Path | None, Path | None],
) -> None:  # fmt: skip
    """Both sides trained by the `compare` flow, recorded in MLflow."""
    from flows.environment.prefect_settings import TemporaryServer, apply_project_settings

    apply_project_settings()
    server = TemporaryServer()
    server.start()
    from flows.compare import compare

    server.wait()
    train_tokens, validation_tokens, tokenizer = (str(source) if source else None for source in sources)
    compare(
        params_path=str(path),
        overrides=overrides,
        axis=axis,
        values=chosen,
        max_steps=limits.max_steps,
        training_examples=limits.training_examples,
        validation_examples=limits.validation_examples,
        batch_size=batch_size,
        precision=precision,
        train_tokens=train_tokens,
        validation_tokens=validation_tokens,
        tokenizer=tokenizer,
    )


def replay_command(
    outbox: Path = typer.Argument(..., help="an outbox file, as a run's warning named it"),
    tracking_uri: str | None = typer.Option(
        None, "--tracking-uri", help="the store to send to (default: the one the outbox was written for)"
    ),
) -> None:
    """Send the tracking records a run left in an outbox (its store was away) to the store it was written
    for, in order, each once; what the store refuses stays in the file, listed (exit 1)."""

    from tasks.tracking.delivery.outbox import Outbox
    from tasks.tracking.delivery.replay import replay_into
    from tasks.tracking.store import TrackingError, redact, target_of

    if not outbox.exists():
        raise ConfigError(f"{outbox}: not found (an outbox file, as a run's warning named it)")
    if outbox.is_dir():
        raise ConfigError(f"{outbox}: is a folder; pass one outbox file (*.jsonl) in it")
    box = Outbox.open(outbox)
    # The chosen store, not set in the environment: a replay run inside another process (the suite's)
    # must leave that process's MLFLOW_TRACKING_URI as it found it.
    target = target_of(
        _replay_store(box, tracking_uri), "--tracking-uri" if tracking_uri else "the outbox's store"
    )
    report = replay_into(target, box)
    shown = redact(target.uri)
    skipped = f"; {report.skipped_records} skipped ({report.last_error})" if report.skipped_records else ""
    print(f"sent {report.delivered_late} records ({report.sent_metrics} metric values) to {shown}{skipped}")
    if report.given_up_calls:
        raise TrackingError(
            f"{outbox}: {report.last_error}; those records are kept in it, with "
            f"{report.waiting_records} in all: fix what the store refused, then run this again"
        )
    if report.waiting_records:
        raise TrackingError(
            f"{outbox}: {report.waiting_records} records still wait ({report.last_error}); run this again "
            "once the store answers"
        )


def _replay_store(box: Outbox, given: str | None) -> str:
    """The store a replay sends to: `--tracking-uri`, else the one the outbox was written for.
    MLFLOW_TRACKING_URI never silently replaces it (experiment ids are the store's own)."""
    from tasks.tracking.store import redact

    recorded = box.tracking_uri
    if given:
        return given
    environment = os.environ.get("MLFLOW_TRACKING_URI")
    if recorded and "***" not in recorded:
        if environment and environment != recorded:
            note = f"MLFLOW_TRACKING_URI {redact(environment)} (--tracking-uri chooses)"
            print(
                f"note: replaying into {recorded}, the store the outbox was written for, not {note}",
                file=sys.stderr,
            )
        return recorded
    if recorded and environment and redact(environment) == recorded:
        return environment  # the recorded store, its password from the environment
    raise ConfigError(
        f"{box.path}: the store it was written for is not recorded in full ({recorded or 'none'}); "
        "pass --tracking-uri"
    )
