"""`gptpipe run`: the end-to-end pipeline for one parameter file (iteration 1 without arguments)."""

from __future__ import annotations

from pathlib import Path

import typer

from flows.cli import app
from gptcore.config import STAGES
from gptcore.errors import ConfigError


def _params_file(params: Path | None, iteration: int | None) -> Path:
    from gptcore.config import iteration_file

    if params is not None and iteration is not None:
        raise ConfigError("--params and --iteration name the parameters twice; give one of them")
    if params is not None:
        return params
    return iteration_file(iteration or 1)


@app.command("run")
def run(
    params: Path | None = typer.Option(None, "--params", help="parameter file (default: iteration 1's)"),
    iteration: int | None = typer.Option(None, "--iteration", help="use params/iteration_N.yaml"),
    overrides: list[str] = typer.Option([], "--set", help="override a parameter: key.path=value"),
    until: str = typer.Option("full", "--until", help=f"last stage to run: {', '.join(STAGES)}"),
) -> None:
    """Run tokenizer → tokens → device → smoke → full, taking unchanged stages from the cache."""
    from gptcore.config import load_params

    if until not in STAGES:
        raise ConfigError(f"--until {until!r} is not allowed: expected one of {', '.join(STAGES)}")
    params_path = _params_file(params, iteration)
    checked = load_params(params_path, overrides)  # every value checked before anything starts

    from flows.prefect_env import TemporaryServer, apply_project_settings
    from flows.startup import bulk_imports

    apply_project_settings()
    server = TemporaryServer()
    server.start()
    # While the server comes up: the imports every run needs, and the MLflow store opened and checked.
    with bulk_imports():
        import prefect.flow_engine  # noqa: F401  (otherwise imported when the flow starts)

        from flows.pipeline import end_to_end
        from gptcore import runtime  # noqa: F401  (torch)
        from tasks.tracking import TrackingSession

        TrackingSession.prepare(checked.tracking)
    server.wait()
    end_to_end(params_path=str(params_path), overrides=list(overrides), until=until)
