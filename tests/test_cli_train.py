"""`gptpipe device | train | generate`: flags, JSON lines, one-line errors with the right exit codes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from flows.cli.dependencies import install_command
from flows.cli.main import main
from gptcore.runtime import malloc as host_memory
from gptcore.runtime.precision_speed import PrecisionSpeed, PrecisionSpeeds

ROOT = Path(__file__).resolve().parent.parent
TINY_PARAMS = {
    "iteration": 1,
    "model": {
        "name": "tiny",
        "architecture": {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16, "vocab_size": 300},
        "cpu": {"batch_size": 4},
        "gpu": {"batch_size": 4},
    },
    "tokenizer": {"vocab_size": 300},
    "full": {
        "max_steps": 6,
        "log_every": 2,
        "eval_every": 6,
        "checkpoint_every": 3,
        "training_examples": 64,
        "validation_examples": 8,
    },
}


def _lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _params(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY_PARAMS))
    return path


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_train_on_cuda_without_cuda_exits_2_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "flows.cli.main", "train", "--device", "cuda", "--dry-run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stderr.strip().count("\n") == 0
    assert result.stderr.startswith("error: --device cuda: CUDA is not available")


def test_dry_run_of_iteration_1_reports_the_profile_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "checkpoints"
    assert (
        main(
            [
                "train",
                "--iteration",
                "1",
                "--dry-run",
                "--device",
                "cpu",
                "--checkpoint-directory",
                str(directory),
            ]
        )
        == 0
    )
    startup, summary = _lines(capsys.readouterr().out)
    assert startup["event"] == "startup" and startup["parameter_count"] == 5_322_240
    assert startup["sequence_length"] == 256 and startup["batch_size"] == 8 and startup["device"] == "cpu"
    assert startup["host_allocator"] == host_memory.describe()  # what the command's start-up applied
    assert summary["event"] == "summary" and summary["steps"] == 0
    assert not directory.exists()


def test_flags_override_the_parameter_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "train",
        "--params",
        str(_params(tmp_path)),
        "--dry-run",
        "--batch-size",
        "2",
        "--grad-accum",
        "3",
        "--precision",
        "bf16",
        "--max-steps",
        "5",
        "--set",
        "full.optimizer.learning_rate=1e-2",
    ]
    assert main(args) == 0
    startup = _lines(capsys.readouterr().out)[0]
    assert (startup["batch_size"], startup["grad_accum_steps"], startup["precision"]) == (2, 3, "bf16")
    assert startup["max_steps"] == 5


def test_bad_flag_values_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--batch-size", "0", "--dry-run"]) == 2
    assert main(["train", "--precision", "fp8", "--dry-run"]) == 2
    assert main(["train", "--params", str(_params(tmp_path))]) == 2  # no token file, no --synthetic
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 3 and all(line.startswith("error: ") for line in errors)
    assert "--batch-size" in errors[0] and "fp8" in errors[1] and "--train-tokens" in errors[2]


def _tokenizer(path: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=280, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(["def train(model):\n    return model\n"] * 20, trainer)
    tokenizer.save(str(path))
    return path


def test_train_writes_json_lines_and_checkpoints_then_generate_samples(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "run"
    tokenizer = _tokenizer(tmp_path / "tokenizer.json")
    args = [
        "train",
        "--params",
        str(_params(tmp_path)),
        "--synthetic",
        "--device",
        "cpu",
        "--checkpoint-directory",
        str(directory),
        "--tokenizer",
        str(tokenizer),
        "--no-track",  # MLflow recording has its own tests; this one stays out of the project's store
    ]
    assert main(args) == 0
    lines = _lines(capsys.readouterr().out)
    events = [line["event"] for line in lines]
    assert events[0] == "startup" and events[-1] == "summary" and events.count("step") == 3
    assert {"train_loss", "learning_rate", "grad_norm", "tokens_per_second", "mfu"} <= set(lines[1])
    summary = lines[-1]
    assert summary["steps"] == 6 and summary["final_checkpoint"] == str(directory / "final.pt")
    assert (directory / "step-00000003.pt").is_file()

    generate = [
        "generate",
        "--checkpoint-directory",
        str(directory),
        "--prompt",
        "def ",
        "--max-new-tokens",
        "5",
        "--json",
    ]
    assert main(generate) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["new_tokens"] == 5 and result["step"] == 6 and isinstance(result["completion"], str)


def test_device_json_reports_the_environment(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["device", "--device", "cpu", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["device"] == "cpu" and report["torch_version"] == torch.__version__
    assert isinstance(report["fused_adamw_supported"], bool)


def test_a_dry_run_at_a_batch_far_beyond_memory_only_estimates(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # 2048 x 1024 tokens against gpt_100m's 16k vocabulary: the step's logits alone would be 64 GiB, and
    # the peak probe used to multiply matrices of that size (in bf16: minutes where the CPU emulates it)
    # before the dry run could answer. It multiplies nothing now: no peak, nothing trained.
    from gptcore.runtime import device, flops

    slow = PrecisionSpeeds("cpu", (PrecisionSpeed("bf16", "cpu", 0.15, 2.5, False),))
    monkeypatch.setattr(device, "measure_precision_speeds", lambda name: slow)
    monkeypatch.setattr(flops, "measured_matmul_peak", lambda *a, **k: pytest.fail("a dry run measured"))
    args = ["train", "--iteration", "3", "--device", "cpu", "--precision", "bf16", "--dry-run"]
    assert main([*args, "--batch-size", "2048", "--grad-accum", "1"]) == 0
    out, err = capsys.readouterr()
    startup, summary = _lines(out)
    assert startup["batch_size"] == 2048 and summary["estimated_peak_memory_bytes"] > 64 * 2**30
    assert startup["peak_flops_source"] == "not measured: a dry run multiplies nothing"
    assert startup["precision"] == "bf16" and "0.15x fp32's speed" in startup["precision_warning"]
    assert err.splitlines() == [f"warning: {startup['precision_warning']}"]


HIDE_PACKAGES = """
import builtins, sys
hidden = set(sys.argv[1].split(","))
real_import = builtins.__import__
def hiding_import(name, *args, **kwargs):
    if name.split(".")[0] in hidden:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    return real_import(name, *args, **kwargs)
builtins.__import__ = hiding_import
sys.argv = ["gptpipe", *sys.argv[2:]]
from flows.cli.main import entry
entry()
"""


def _without(packages: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`gptpipe ARGS` in a process where importing any of `packages` fails, as on a bare GPU image."""
    command = [sys.executable, "-c", HIDE_PACKAGES, packages, *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_a_missing_dependency_is_one_line_naming_the_package_and_the_way_around(tmp_path: Path) -> None:
    tracked = _without(
        "mlflow", "train", "--params", str(_params(tmp_path)), "--synthetic", "--max-steps", "1"
    )
    assert tracked.returncode == 1 and "Traceback" not in tracked.stderr
    assert tracked.stderr.strip().splitlines() == [
        f"error: the Python package 'mlflow' is not installed: {install_command()} 'mlflow>=3.17.2,<4', "
        "or add --no-track (gptpipe train, gptpipe compare) to run without MLflow"
    ]
    no_pydantic = _without("pydantic", "train", "--iteration", "1", "--dry-run")
    assert no_pydantic.returncode == 1
    assert (
        no_pydantic.stderr.strip()
        == f"error: the Python package 'pydantic' is not installed: {install_command()} 'pydantic>=2.7'"
    )


def test_a_missing_package_is_installed_by_this_environments_own_installer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Makefile's venv has uv and no pip: a bare `pip install` there would be another Python's pip."""
    from flows.cli import dependencies

    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    monkeypatch.setattr(sys, "executable", str(python))
    monkeypatch.setattr(dependencies, "has_pip", lambda: False)
    assert install_command() == "pip install"  # no uv beside it either: pip is all there is to name
    (python.parent / "uv").touch()
    assert install_command() == f"{python.parent / 'uv'} pip install --python {python}"
    monkeypatch.setattr(dependencies, "has_pip", lambda: True)
    assert install_command() == "pip install"  # its own pip, where it has one


def test_asking_whether_pip_is_here_leaves_setuptools_distutils_in_place() -> None:
    """setuptools' shim stands down for the whole process once anything looks for pip through the import
    system; torch's compiler then failed at start-up on the standard library's distutils."""
    probe = (
        "import sys; from flows.cli.dependencies import has_pip; has_pip(); import setuptools, distutils; "
        "assert '_distutils' in distutils.__file__, distutils.__file__"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow
def test_training_without_tracking_needs_neither_mlflow_nor_prefect(tmp_path: Path) -> None:
    args = ["train", "--params", str(_params(tmp_path)), "--synthetic", "--max-steps", "2", "--no-track"]
    result = _without("mlflow,prefect,datasets", *args, "--checkpoint-directory", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    assert _lines(result.stdout)[-1]["steps"] == 2


def _on_a_terminal(*args: str) -> tuple[int, str]:
    """`gptpipe` with stdout and stderr on a pseudo-terminal, as a person runs it: its exit code, output."""
    import os
    import pty

    main_end, terminal = pty.openpty()
    command = [
        sys.executable,
        "-c",
        "import sys; from flows.cli.main import main; sys.exit(main(sys.argv[1:]))",
    ]
    process = subprocess.Popen([*command, *args], stdout=terminal, stderr=terminal, cwd=ROOT)
    os.close(terminal)
    chunks = []
    while True:
        try:
            chunk = os.read(main_end, 65536)
        except OSError:  # the terminal closed: the process is done
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main_end)
    return process.wait(timeout=120), b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
def test_a_terminal_gets_a_progress_bar_and_the_summary_and_json_gets_every_line(tmp_path: Path) -> None:
    args = ["train", "--params", str(_params(tmp_path)), "--synthetic", "--max-steps", "6", "--no-track"]
    code, shown = _on_a_terminal(*args, "--checkpoint-directory", str(tmp_path / "bar"))
    assert code == 0, shown
    assert "full" in shown and "6/6" in shown and "tokens/s" in shown and "loss " in shown
    assert re.search(r"eager\s+\(auto:\s+off\s+on\s+cpu", shown), (
        "the start-up line: compiled or not, and why"
    )
    assert re.search(r"attention\s+\w+", shown)
    events = re.findall(r'\{"event": "(\w+)"', shown)  # the terminal's control codes may precede a line
    assert events == ["summary"]  # the records a script wants, without the step lines
    code, shown = _on_a_terminal(*args, "--checkpoint-directory", str(tmp_path / "json"), "--json")
    assert code == 0, shown
    events = re.findall(r'\{"event": "(\w+)"', shown)
    assert events[0] == "startup" and events[-1] == "summary" and "step" in events and "6/6" not in shown


def test_a_parameter_file_piped_from_the_shell_is_read(tmp_path: Path) -> None:
    """`gptpipe train --params <(...)`: the path is a pipe, readable once; a missing path stays refused."""
    read_end, write_end = os.pipe()
    os.write(write_end, (ROOT / "params" / "iteration_1.yaml").read_bytes())
    os.close(write_end)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "flows.cli.main", "train", "--params", f"/dev/fd/{read_end}", "--dry-run"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            pass_fds=(read_end,),
        )
    finally:
        os.close(read_end)
    assert result.returncode == 0, result.stderr
    assert _lines(result.stdout)[0]["parameter_count"] == 5_322_240
    assert main(["train", "--params", str(tmp_path / "missing.yaml"), "--dry-run"]) == 2
    assert main(["train", "--params", str(tmp_path), "--dry-run"]) == 2  # a folder: named as one
