"""The GPU check's figures: reads one part's output, prints its line, adds it to `results.json`;
`summary` writes `summary.md` from them. Standard library only: it runs on the GPU machine's bare image.

    python bench/gpu_check_report.py OUT device PART STDOUT STDERR RC
    python bench/gpu_check_report.py OUT train PART STDOUT STDERR RC
    python bench/gpu_check_report.py OUT compare PART STDOUT STDERR RC
    python bench/gpu_check_report.py OUT oom PART STDOUT STDERR RC [EXPECTED_PREFIX]
    python bench/gpu_check_report.py OUT summary
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

GIB = 2**30


def json_lines(text: str) -> list[dict[str, Any]]:
    records = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def read_device(stdout: str) -> dict[str, Any]:
    report = json_lines(stdout)
    return report[-1] if report else {}


def read_train(stdout: str) -> dict[str, Any]:
    records = json_lines(stdout)
    start = next((r for r in records if r.get("event") == "startup"), {})
    end = next((r for r in records if r.get("event") == "summary"), {})
    keys = ("gpu_name", "device", "precision", "batch_size", "grad_accum_steps", "parameter_count")
    extra = ("fused_adamw", "tf32_enabled", "activation_checkpointing", "batch_size_source", "batch_probe")
    figures = {k: start.get(k) for k in (*keys, *extra)}
    for key in (
        "steps",
        "tokens_per_second",
        "mfu",
        "peak_flops",
        "peak_memory_bytes",
        "training_peak_memory_bytes",
        "estimated_peak_memory_bytes",
        "checkpoint_save_seconds",
        "final_train_loss",
        "final_val_loss",
        "elapsed_seconds",
        "dry_run",
    ):
        figures[key] = end.get(key)
    return figures


def read_compare(stdout: str) -> dict[str, Any]:
    event = next((r for r in json_lines(stdout) if r.get("event") == "comparison"), {})
    table = [line for line in stdout.splitlines() if line.startswith("|")]
    return {"axis": event.get("axis"), "runs": event.get("runs"), "table": "\n".join(table)}


def read_oom(stderr: str, rc: int, expected: str) -> dict[str, Any]:
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    handled = (
        rc == 1
        and len(errors) == 1
        and errors[0].startswith(expected)
        and not any("Traceback" in line for line in lines)
    )
    return {"handled": handled, "error_line": errors[0] if errors else None, "stderr_lines": len(lines)}


def line_for(kind: str, part: str, figures: dict[str, Any], rc: int) -> str:
    if kind == "device":
        return (
            f"{part}: {figures.get('gpu_name') or figures.get('processor')}"
            f" torch {figures.get('torch_version')} cuda {figures.get('torch_cuda_version')}"
            f" bf16={figures.get('bf16_supported')}"
            f" tf32={figures.get('tf32_supported')} fused_adamw={figures.get('fused_adamw_supported')}"
        )
    if kind == "train":
        if figures.get("tokens_per_second") is None:
            return f"{part}: no summary (exit {rc})"
        if figures.get("dry_run"):
            return (
                f"{part}: dry run, {figures['device']} {figures['precision']} batch {figures['batch_size']}x"
                f"{figures['grad_accum_steps']} ({figures.get('batch_size_source') or 'configured'}):"
                f" estimated peak memory {(figures['estimated_peak_memory_bytes'] or 0) / GIB:.2f} GiB"
            )
        measured = figures.get("training_peak_memory_bytes") or figures["peak_memory_bytes"] or 0
        estimate = figures["estimated_peak_memory_bytes"] or 0
        return (
            f"{part}: {figures['device']} {figures['precision']} batch {figures['batch_size']}x"
            f"{figures['grad_accum_steps']} ({figures.get('batch_size_source') or 'configured'}"
            f"{', activation checkpointing' if figures.get('activation_checkpointing') else ''})"
            f" steps {figures['steps']}: {figures['tokens_per_second']:,.0f} tokens/s,"
            f" MFU {figures['mfu'] or 0:.3f} of {(figures['peak_flops'] or 0) / 1e12:.1f} TFLOP/s,"
            f" training peak memory {measured / GIB:.2f} GiB (estimated {estimate / GIB:.2f},"
            f" estimate/measured {estimate / measured if measured else 0:.2f}),"
            f" checkpoint save {figures['checkpoint_save_seconds'] or 0:.2f} s"
            + _probe(figures.get("batch_probe"))
        )
    if kind == "compare":
        return f"{part}: axis {figures.get('axis')}\n{figures.get('table')}"
    return f"{part}: handled={figures['handled']} exit {rc}: {figures['error_line']}"


def _probe(probe: dict[str, Any] | None) -> str:
    """The batch probe's figures, where `--batch-size auto` decided the batch."""
    if not probe:
        return ""
    tried = " ".join(f"{size}{'+' if ok else '-'}" for size, ok in probe.get("tried", []))
    largest = probe.get("largest_that_ran", probe.get("largest_fitting"))
    return f"; batch probe: largest {largest}, margin {probe.get('margin')}, tried {tried}"


def record(out: Path, kind: str, part: str, stdout: str, stderr: str, rc: int, expected: str) -> bool:
    if kind == "device":
        figures = read_device(stdout)
    elif kind == "train":
        figures = read_train(stdout)
    elif kind == "compare":
        figures = read_compare(stdout)
    else:
        figures = read_oom(stderr, rc, expected)
    ok = figures.get("handled", False) if kind == "oom" else rc == 0
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    results[part] = {"kind": kind, "exit_code": rc, "ok": ok, **figures}
    results_path.write_text(json.dumps(results, indent=1))
    print(("  " if ok else "  FAILED ") + line_for(kind, part, figures, rc), flush=True)
    return ok


def summary(out: Path) -> str:
    results = json.loads((out / "results.json").read_text())
    lines = ["# GPU check", ""]
    for part, figures in results.items():
        line = line_for(figures["kind"], part, figures, figures["exit_code"])
        lines.append(("- " if figures["ok"] else "- FAILED ") + line)
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    return text


def main(argv: list[str]) -> int:
    out, kind = Path(argv[0]), argv[1]
    if kind == "summary":
        print(summary(out), end="")
        return 0
    part, stdout, stderr, rc = argv[2], Path(argv[3]), Path(argv[4]), int(argv[5])
    expected = argv[6] if len(argv) > 6 else "error: out of memory"
    texts = stdout.read_text(errors="replace"), stderr.read_text(errors="replace")
    ok = record(out, kind, part, *texts, rc, expected)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
