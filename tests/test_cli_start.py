"""What `gptpipe` loads before it answers: its help, and its refusal of a bad parameter file or flag, come
before torch, Prefect and MLflow are imported (each costs a second or more of start-up), so a mistake is
told at once and the suite's many refusals cost little."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "prefect", "mlflow")
PROBE = f"""
import json, sys
from flows.cli.main import main
code = main(sys.argv[1:])
print(json.dumps({{"code": code, "loaded": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["run", "--help"],
        ["run", "--params", "{bad}"],
        ["run", "--params", "{missing}"],
        ["train", "--params", "{bad}", "--dry-run"],
        ["train", "--params", "{bad}", "--device", "tpu"],
        ["finetune", "--params", "{bad}"],
        ["sweep", "--params", "{bad}"],
        ["scale", "--params", "{bad}"],
    ],
    ids=[
        "help",
        "run-help",
        "run-bad-file",
        "run-missing-file",
        "train-bad-file",
        "train-bad-device",
        "finetune-bad-file",
        "sweep-bad-file",
        "scale-bad-file",
    ],
)
def test_help_and_refusals_answer_before_torch_prefect_and_mlflow_load(
    tmp_path: Path, argv: list[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("iteration: 1\nmodel: {depth: 3}\n")  # the dial needs the vocabulary: refused
    paths = {"bad": str(bad), "missing": str(tmp_path / "missing.yaml")}
    args = [arg.format(**paths) for arg in argv]
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["loaded"] == [], f"{' '.join(args)} imported {outcome['loaded']} before answering"
    if "--help" in args:
        assert outcome["code"] == 0
    else:
        assert outcome["code"] == 2 and done.stderr.strip().startswith("error: "), done.stderr
