"""The GPU check's figures: reads one part's output, prints its line, adds it to `results.json`;
`summary` writes `summary.md` from them, with the targets judged. It runs on the GPU machine's bare image:
the standard library, and the pipeline's own estimate of a run's time (`gptcore.train.estimate`).

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
    compiling = ("compile", "compile_source", "attention_backend")
    plan = ("validation_examples", "eval_every", "eval_at_start", "checkpoint_every")
    figures = {k: start.get(k) for k in (*keys, *extra, *compiling, *plan)}
    for key in (
        "steps",
        "tokens_per_second",
        "steps_per_second",
        "compile_seconds",
        "recompilations",
        "evaluation_seconds",
        "evaluated_examples",
        "checkpoint_stall_seconds",
        "checkpoint_wait_seconds",
        "checkpoint_saves",
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
            + _compiling(figures)
            + _probe(figures.get("batch_probe"))
        )
    if kind == "compare":
        return f"{part}: axis {figures.get('axis')}\n{figures.get('table')}"
    return f"{part}: handled={figures['handled']} exit {rc}: {figures['error_line']}"


def _compiling(figures: dict[str, Any]) -> str:
    """Compiled or eager, and why; the attention kernel; a fallback to math attention named."""
    if figures.get("compile"):
        how = (
            f"compiled in {figures.get('compile_seconds') or 0:.1f} s ({figures.get('compile_source')}),"
            f" recompilations {figures.get('recompilations')}"
        )
    else:
        how = f"eager ({figures.get('compile_source')})"
    fallback = (
        " (bf16 on an H100/H200-class GPU fell back to math attention)" if math_fallback(figures) else ""
    )
    return f"; {how}; attention {figures.get('attention_backend')}{fallback}"


def math_fallback(figures: dict[str, Any]) -> bool:
    """A bf16 run on an H100/H200-class GPU whose attention runs the math kernel: flash, cuDNN and
    memory-efficient attention all serve these shapes there, so math means something is off."""
    return (
        figures.get("device") == "cuda"
        and figures.get("precision") == "bf16"
        and hopper_class(figures.get("gpu_name"))
        and figures.get("attention_backend") == "math"
    )


def hopper_class(gpu_name: str | None) -> bool:
    return any(model in (gpu_name or "") for model in ("H100", "H200", "GH200"))


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
    ok = figures.get("handled", False) if kind == "oom" else rc == 0 and not math_fallback(figures)
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    results[part] = {"kind": kind, "exit_code": rc, "ok": ok, **figures}
    results_path.write_text(json.dumps(results, indent=1))
    print(("  " if ok else "  FAILED ") + line_for(kind, part, figures, rc), flush=True)
    return ok


# The targets, stated for an H200 (figures of nanoGPT-class code: about 40-50% MFU on an A100/H100 for
# a 124M model): judged on an H100/H200-class GPU, stated only elsewhere. A missed target is reported,
# not a failed part: the check's exit status says whether everything ran and behaved.
MFU_TARGET = 0.45  # gpt_100m bf16 compiled
COMPILE_RATIO_TARGET = 1.3  # compiled tokens/s over eager at the same batch
ESTIMATE_TOLERANCE = 0.15  # the smoke-style estimate of a longer run against its measured time


def targets(results: dict[str, Any]) -> list[str]:
    """The targets section: each figure, its target, and whether it was met (or why not judged)."""
    compiled, eager = results.get("bf16_100m", {}), results.get("bf16_100m_eager", {})
    judged = compiled.get("device") == "cuda" and hopper_class(compiled.get("gpu_name"))
    where = "judged" if judged else f"not judged on {compiled.get('gpu_name') or compiled.get('device')}"
    lines = ["", f"## Targets ({where}: they are for an H100/H200-class GPU)", ""]

    def judge(name: str, value: float | None, met: bool, text: str) -> None:
        verdict = "not measured" if value is None else ("met" if met else "MISSED") if judged else "-"
        lines.append(f"- {name}: {text}: {verdict}")

    mfu = compiled.get("mfu")
    judge(
        "mfu",
        mfu,
        mfu is not None and mfu >= MFU_TARGET,
        f"gpt_100m bf16 compiled {_figure(mfu, '.3f')} (target >= {MFU_TARGET})",
    )
    fast, slow = compiled.get("tokens_per_second"), eager.get("tokens_per_second")
    ratio = fast / slow if fast and slow else None
    judge(
        "compiled_over_eager",
        ratio,
        ratio is not None and ratio >= COMPILE_RATIO_TARGET,
        f"{_figure(fast, ',.0f')} / {_figure(slow, ',.0f')} tokens/s = {_figure(ratio, '.2f')}"
        f" (target >= {COMPILE_RATIO_TARGET}; compile: {compiled.get('compile')} against"
        f" {eager.get('compile')})",
    )
    full = results.get("full_100m", {})
    estimate = run_estimate(compiled, full)
    # Judged outside compilation: the estimate counts bf16_100m's cold compilation, while full_100m
    # compiles the same graphs again from inductor's cache on this machine (as a pipeline's full run
    # does after its smoke run), seconds a real full run of hours does not notice and a short one does.
    rest = estimate.total_seconds - estimate.compile_seconds if estimate else None
    measured = full.get("elapsed_seconds")
    measured_rest = measured - (full.get("compile_seconds") or 0.0) if measured is not None else None
    error = abs(rest / measured_rest - 1) if rest and measured_rest else None
    judge(
        "full_estimate",
        error,
        error is not None and error <= ESTIMATE_TOLERANCE,
        f"bf16_100m's figures estimate full_100m at {_figure(estimate and estimate.total_seconds, '.1f')} s"
        f" (compiling {_figure(estimate and estimate.compile_seconds, '.1f')} s), measured"
        f" {_figure(measured, '.1f')} s (compiling {_figure(full.get('compile_seconds'), '.1f')} s); outside"
        f" compilation {_figure(rest, '.1f')} against {_figure(measured_rest, '.1f')} s, off by"
        f" {_figure(error, '.1%')} (target within {ESTIMATE_TOLERANCE:.0%})",
    )
    return lines


def run_estimate(smoke: dict[str, Any], full: dict[str, Any]) -> Any:
    """The smoke stage's estimate (gptcore.train.estimate.RunTimeEstimate) of `full`'s run, priced by
    `smoke`'s figures, its plan counted from `full`'s settings; None without both."""
    from gptcore.train.config import TrainingConfig
    from gptcore.train.estimate import RunPlan, estimate_run
    from gptcore.train.records import SummaryRecord

    if not full.get("steps") or full.get("eval_every") is None:
        return None
    settings = {key: full[key] for key in ("eval_every", "eval_at_start", "checkpoint_every")}
    plan = RunPlan.of(TrainingConfig(**settings), full["steps"], full.get("validation_examples") or 0)
    return estimate_run(SummaryRecord.from_dict(smoke), plan)  # the summary line's figures


def _figure(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def summary(out: Path) -> str:
    results = json.loads((out / "results.json").read_text())
    lines = ["# GPU check", ""]
    for part, figures in results.items():
        line = line_for(figures["kind"], part, figures, figures["exit_code"])
        lines.append(("- " if figures["ok"] else "- FAILED ") + line)
    lines += targets(results)
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
