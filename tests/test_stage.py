"""A stage's cache key follows the code its module reaches by imports: nobody lists it by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

import tasks.stage as stage_module
from tasks.stage import code_reached


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkout of three rooms: a stage, the engine it calls (one module only lazily), the MLflow side."""
    files = {
        "tasks/stages/probe.py": "from gptcore.work import run\nfrom tasks.tracking.record import log\n",
        "gptcore/work.py": "def run():\n    from gptcore.detail import step\n    return step()\n",
        "gptcore/detail.py": "def step():\n    return 1\n",
        "gptcore/unused.py": "X = 1\n",
        "tasks/tracking/record.py": "from gptcore.unused import X\ndef log():\n    return X\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(stage_module, "ROOT", tmp_path)
    for cached in (stage_module._reached, stage_module._imports, stage_module._module_file):
        cached.cache_clear()
    yield tmp_path
    for cached in (stage_module._reached, stage_module._imports, stage_module._module_file):
        cached.cache_clear()


def test_the_key_follows_a_lazy_import_into_the_engine(tree: Path) -> None:
    reached = stage_module._reached("tasks.stages.probe")
    assert reached == {"tasks.stages.probe", "gptcore.work", "gptcore.detail"}
    before = code_reached("tasks.stages.probe")
    (tree / "gptcore/detail.py").write_text("def step():\n    return 2\n")
    assert code_reached("tasks.stages.probe") != before, "an edit of code the stage runs is a new key"


def test_the_mlflow_side_and_code_nobody_imports_leave_the_key_alone(tree: Path) -> None:
    before = code_reached("tasks.stages.probe")
    (tree / "tasks/tracking/record.py").write_text("def log():\n    return 2\n")
    (tree / "gptcore/unused.py").write_text("X = 2\n")
    assert code_reached("tasks.stages.probe") == before


def test_every_pipeline_stage_reaches_the_code_it_computes_with() -> None:
    reached = stage_module._reached
    trains = {"gptcore.model.gpt", "gptcore.train.trainer", "gptcore.train.step"}
    assert trains <= reached("tasks.stages.full")
    assert "gptcore.eval.held_out" in reached("tasks.stages.evaluate")
    assert {"gptcore.model.quantization", "gptcore.eval.quant_tradeoff"} <= reached("tasks.stages.quantize")
    assert {"gptcore.export.hf", "gptcore.export.hf_llama"} <= reached("tasks.stages.export")
    assert {"gptcore.checkpoint.merge", "gptcore.finetune.lora"} <= reached("tasks.stages.merge")
    assert not any(name.startswith("tasks.tracking") for name in reached("tasks.stages.evaluate"))
