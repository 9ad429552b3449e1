"""The GPU check's plumbing, which runs where no test can: its arguments and how it reads each part."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("gpu_check_report", ROOT / "bench" / "gpu_check_report.py")
assert spec is not None and spec.loader is not None
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)

OOM_LINE = "error: out of memory on cuda at batch size 2048 (estimated peak 945.7 GiB): rerun with ..."


def test_the_check_script_parses_and_refuses_unknown_arguments() -> None:
    assert subprocess.run(["bash", "-n", str(ROOT / "bench" / "gpu_check.sh")]).returncode == 0
    result = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_check.sh"), "--gpu"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2 and "unknown argument --gpu" in result.stderr


def test_the_out_of_memory_response_counts_only_as_one_line_exit_1_and_no_traceback() -> None:
    expected = "error: out of memory on cuda at batch size 2048"
    assert report.read_oom(OOM_LINE + "\n", 1, expected)["handled"]
    assert not report.read_oom(OOM_LINE + "\n", 0, expected)["handled"]
    assert not report.read_oom("Traceback (most recent call last):\n" + OOM_LINE, 1, expected)["handled"]
    assert not report.read_oom("error: CUDA is not available\n", 1, expected)["handled"]


def test_a_training_part_is_read_from_its_startup_and_summary_lines(tmp_path: Path) -> None:
    startup = {
        "event": "startup",
        "device": "cuda",
        "precision": "bf16",
        "batch_size": 32,
        "grad_accum_steps": 4,
        "batch_size_source": "probed",
        "batch_probe": {
            "largest_that_ran": 36,
            "margin": 0.1,
            "tried": [[32, True], [64, False], [36, True]],
        },
    }
    summary = {
        "event": "summary",
        "steps": 30,
        "tokens_per_second": 400_000.0,
        "mfu": 0.25,
        "peak_flops": 989e12,
        "peak_memory_bytes": 41 * 2**30,
        "training_peak_memory_bytes": 40 * 2**30,
        "estimated_peak_memory_bytes": 38 * 2**30,
        "checkpoint_save_seconds": 1.5,
        "dry_run": False,
    }
    stdout = tmp_path / "bf16.out"
    stdout.write_text("\n".join(json.dumps(r) for r in (startup, {"event": "step"}, summary)) + "\n")
    stderr = tmp_path / "bf16.err"
    stderr.write_text("")
    assert report.main([str(tmp_path), "train", "bf16_100m", str(stdout), str(stderr), "0"]) == 0
    assert report.main([str(tmp_path), "train", "failed", str(stderr), str(stderr), "1"]) == 1
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["bf16_100m"]["tokens_per_second"] == 400_000.0 and results["bf16_100m"]["ok"]
    assert not results["failed"]["ok"]
    report.main([str(tmp_path), "summary"])
    lines = (tmp_path / "summary.md").read_text().splitlines()
    assert "cuda bf16 batch 32x4 (probed) steps 30: 400,000 tokens/s, MFU 0.250 of 989.0 TFLOP/s" in lines[2]
    assert "training peak memory 40.00 GiB (estimated 38.00, estimate/measured 0.95)" in lines[2]
    assert lines[2].endswith("batch probe: largest 36, margin 0.1, tried 32+ 64- 36+")
    assert lines[3] == "- FAILED failed: no summary (exit 1)"


def part(tmp_path: Path, name: str, startup: dict, summary: dict) -> int:
    """One training part recorded as the check records it: its exit code from the report."""
    base = {"device": "cuda", "precision": "bf16", "gpu_name": "NVIDIA H200", "batch_size": 32}
    lines = [{"event": "startup", **base, "grad_accum_steps": 4, **startup}, {"event": "summary", **summary}]
    stdout, stderr = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    stdout.write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    stderr.write_text("")
    return report.main([str(tmp_path), "train", name, str(stdout), str(stderr), "0"])


def figures(tokens_per_second: float, mfu: float, **more: float) -> dict:
    return {"steps": 20, "tokens_per_second": tokens_per_second, "mfu": mfu, "peak_flops": 989e12, **more}


def test_bf16_on_an_h200_that_falls_back_to_math_attention_fails_its_part(tmp_path: Path) -> None:
    assert part(tmp_path, "flash", {"attention_backend": "cudnn"}, figures(5e5, 0.4)) == 0
    assert part(tmp_path, "math", {"attention_backend": "math"}, figures(2e5, 0.1)) == 1
    fp32 = {"attention_backend": "math", "precision": "fp32"}
    assert part(tmp_path, "fp32", fp32, figures(2e5, 0.1)) == 0, "math serves fp32 there: not a fallback"
    lines = report.summary(tmp_path).splitlines()
    assert lines[3].startswith("- FAILED math:") and "attention math (bf16 on an H100/H200" in lines[3]


def test_the_targets_are_judged_on_an_h200_and_only_stated_elsewhere(tmp_path: Path) -> None:
    compiled = {"compile": True, "compile_source": "auto: on for CUDA", "attention_backend": "cudnn"}
    plan = {"eval_every": 25, "eval_at_start": False, "checkpoint_every": 25, "validation_examples": 100}
    smoke = figures(
        6e5, 0.47, steps_per_second=4.0, compile_seconds=24.0, evaluation_seconds=1.0, evaluated_examples=100
    )
    part(tmp_path, "bf16_100m", compiled, smoke)
    part(tmp_path, "bf16_100m_eager", {"compile": False}, figures(5e5, 0.38))
    # 50 steps at 4/s and two evaluations of 100 examples at 0.01 s: 14.5 s outside compilation; 15 taken.
    measured = {**figures(6e5, 0.47, steps=50), "elapsed_seconds": 25.0, "compile_seconds": 10.0}
    part(tmp_path, "full_100m", {**compiled, **plan}, measured)
    text = report.summary(tmp_path)
    assert "## Targets (judged: they are for an H100/H200-class GPU)" in text
    assert "- mfu: gpt_100m bf16 compiled 0.470 (target >= 0.45): met" in text
    assert "= 1.20 (target >= 1.3; compile: True against False): MISSED" in text
    assert "full_100m at 38.5 s (compiling 24.0 s), measured 25.0 s (compiling 10.0 s)" in text
    assert "outside compilation 14.5 against 15.0 s, off by 3.3% (target within 15%): met" in text

    elsewhere = tmp_path / "a100"
    elsewhere.mkdir()
    part(elsewhere, "bf16_100m", {**compiled, "gpu_name": "NVIDIA A100"}, smoke)
    assert "(not judged on NVIDIA A100" in report.summary(elsewhere)
    assert "(target >= 0.45): -" in report.summary(elsewhere)
