"""`gptpipe run`: the end-to-end pipeline for one parameter file (iteration 1 without arguments)."""

from __future__ import annotations

from pathlib import Path

import typer

from flows.cli_options import choice, resolve_params
from gptcore.config import STAGES


def run(
    params: Path | None = typer.Option(None, "--params", help="parameter file (default: iteration 1's)"),
    iteration: int | None = typer.Option(None, "--iteration", help="use params/iteration_N.yaml"),
    overrides: list[str] = typer.Option([], "--set", help="override a parameter: key.path=value"),
    until: str = typer.Option(STAGES[-1], "--until", help=f"last stage to run: {', '.join(STAGES)}"),
) -> None:
    """Run tokenizer → tokens → device → smoke → full → evaluate → export, taking unchanged stages from
    the cache."""
    choice("--until", until, STAGES)
    params_path, checked = resolve_params(params, iteration, overrides)  # checked before anything starts

    from flows.gc_tuning import bulk_imports
    from flows.prefect_env import TemporaryServer, apply_project_settings

    apply_project_settings()
    server = TemporaryServer()
    server.start()
    # While the server comes up: the imports every run needs, and the MLflow store opened and checked.
    with bulk_imports():
        import prefect.flow_engine  # noqa: F401  (otherwise imported when the flow starts)

        from flows.pipeline import end_to_end
        from gptcore import runtime  # noqa: F401  (torch)
        from tasks.tracking import TrackingSession

        TrackingSession.open(checked.tracking)  # checked now; the flow's own open reuses MLflow's store
    server.wait()
    end_to_end(params_path=str(params_path), overrides=list(overrides), until=until)
