"""The Hugging Face exports read alike by the oldest transformers the `hf` extra admits and by the newest:
the tests that load exports with transformers (and PEFT's adapter onto them) run again in a subprocess
whose transformers is the floor's. `make setup` installs that floor beside the venv
(`<venv>/transformers-floor`, a `pip install --target` folder put first on PYTHONPATH; its tokenizers and
huggingface-hub are the ones that transformers release requires), so CI runs both."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FLOOR = Path(sys.prefix) / "transformers-floor"
# Every test that hands an export to transformers or peft.
READERS = ["test_hf_export.py", "test_hf_export_modern.py", "test_chat_template.py", "test_peft_adapter.py"]


def floor_version() -> str:
    """The transformers floor the `hf` extra declares (pyproject.toml)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    (spec,) = [s for s in project["optional-dependencies"]["hf"] if s.startswith("transformers")]
    match = re.fullmatch(r"transformers>=([\d.]+)", spec)
    assert match, f"the hf extra's transformers floor is not a plain >= bound: {spec}"
    return match[1]


@pytest.mark.skipif(not FLOOR.is_dir(), reason=f"{FLOOR} is missing: `make setup` installs the floor there")
def test_the_exports_read_alike_with_the_oldest_transformers_the_extra_admits() -> None:
    # No fork server in the readers' session: they start no `gptpipe`, and its imports cost seconds.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FLOOR), str(REPO)]), "GPTPIPE_TESTS_FORK": "0"}
    said = subprocess.run(
        [sys.executable, "-c", "import transformers; print(transformers.__version__)"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert said.stdout.strip() == floor_version(), "make setup's floor is the one pyproject.toml declares"
    readers = [str(REPO / "tests" / name) for name in READERS]
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *readers],
        env=env, cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-4000:]
    assert " skipped" not in ran.stdout.splitlines()[-1], ran.stdout.splitlines()[-1]
