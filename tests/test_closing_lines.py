"""The lines a person reads when a run ends at a terminal (`flows.closing_lines`)."""

from __future__ import annotations

from typing import Any

from flows.closing_lines import closing_lines
from flows.run_report import RunReport
from tasks.params.loading import PARAMS_DIR
from tasks.params.schema import STAGES

RUN = {"MLflow run": "http://127.0.0.1:5000/#/experiments/1/runs/abc"}


def report(states: dict[str, str], **evaluated: Any) -> RunReport:
    figures = {
        "test_bits_per_byte": 2.0337,
        "unigram_test_bits_per_byte": 2.6952,
        "test_tokens": 496324,
        "registered_model": "gptpipe-iteration-1",
        "model_version": "1",
        "alias": "champion",
        **evaluated,
    }
    stages = []
    for name in STAGES:
        state = states.get(name, "completed")
        stage = {"name": name, "state": state, "outputs": [], "figures": {}, "seconds": 10.0}
        if name == "evaluate":
            stage.update(figures=figures, outputs=["/x/evaluation.json", "/x/samples.md"])
        if name == "full":
            stage["outputs"] = ["/x/final.pt", "/x/best.pt"]
        if state == "failed":
            stage["message"] = "the disk is full"
        stages.append(stage)
    return RunReport.model_validate({"stages": stages})


def test_a_finished_run_says_where_the_model_is_how_good_and_how_to_look() -> None:
    lines = "\n".join(closing_lines(report({}), RUN, str(PARAMS_DIR / "iteration_1.yaml")))
    assert "8 stages (8 completed), 1 min 20 s in the stages." in lines
    assert "Model:     models:/gptpipe-iteration-1@champion (version 1)" in lines
    assert "Test:      2.034 bits per byte on 496,324 held-out test tokens (a unigram model: 2.695)" in lines
    assert "Weights:   /x/best.pt" in lines
    assert f"gptpipe ui   then open {RUN['MLflow run']}" in lines  # iteration 1's file: no flag needed
    assert "gptpipe generate --model models:/gptpipe-iteration-1@champion" in lines
    assert "--json" in lines


def test_a_model_that_did_not_win_is_named_by_its_version_and_says_why() -> None:
    lines = closing_lines(report({}, alias="challenger", model_version="4"), RUN, None)
    model = next(line for line in lines if line.startswith("Model:"))
    assert "models:/gptpipe-iteration-1/4" in model and "did not beat the champion" in model
    refused = "not compared with the champion (version 1): measured on another test split a vs b"
    lines = closing_lines(report({}, alias="challenger", not_compared=refused), RUN, None)
    assert any(line.startswith("Model:") and refused in line for line in lines)


def test_a_failed_run_says_which_stage_why_and_how_to_resume() -> None:
    states = {"full": "failed", "evaluate": "skipped", "export": "skipped", "quantize": "skipped"}
    lines = closing_lines(report(states), RUN, str(PARAMS_DIR / "iteration_2.yaml"))
    assert "Stopped: stage full failed: the disk is full" in lines
    assert any("Run the same command again to resume" in line for line in lines)
    assert not any(line.startswith(("Model:", "Test:")) for line in lines)
    assert any("gptpipe ui --iteration 2" in line for line in lines)


def test_another_parameter_file_is_named_to_the_ui() -> None:
    lines = closing_lines(report({}), RUN, "/tmp/my params.yaml")
    assert any("ui --params '/tmp/my params.yaml'" in line for line in lines)
