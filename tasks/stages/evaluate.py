"""The evaluate stage: the full run's chosen checkpoint measured on the held-out test split, its samples,
and its scores on the standard benchmarks the parameter file lists (lm-evaluation-harness); cached on the
checkpoint's content hash, the test token file's, the settings and the benchmark tasks' own files."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gptcore.errors import ConfigError
from gptcore.tools.atomic import write_json_atomic, write_text_atomic
from gptcore.tools.fingerprint import code_version_of, fingerprint
from tasks.caching import stage_task
from tasks.params.schema import PipelineParams
from tasks.results import CheckpointsResult, EvaluateResult, TokensResult, file_record
from tasks.stages.training import announce, run_directory

if TYPE_CHECKING:
    from gptcore.eval.benchmarks import BenchmarkScores
    from tasks.tracking.models.gate import BenchmarkGate

EVALUATION_FILE = "evaluation.json"
SAMPLES_FILE = "samples.md"
BENCHMARKS_FILE = "benchmarks.json"
_FIGURES = (
    "test_loss",
    "test_perplexity",
    "test_bits_per_byte",
    "unigram_test_loss",
    "unigram_test_bits_per_byte",
    "test_tokens",
    "step",
)


def evaluated_checkpoint(params: PipelineParams, full: CheckpointsResult) -> Path:
    """The checkpoint `evaluate.checkpoint` names in the trained (or merged) folder, by the rule every
    reader follows (`gptcore.checkpoint.load.whole_checkpoint`): one missing or damaged is passed over
    for final, then the newest whole one, with a line saying so, so a retry never fails on it forever."""
    from gptcore.checkpoint.load import whole_checkpoint

    path, passed_over = whole_checkpoint(Path(full.run_directory), params.evaluate.checkpoint)
    if passed_over:
        announce(f"evaluate: {'; '.join(passed_over)}; evaluating {path.name} instead")
    return path


def checkpoint_digest(full: CheckpointsResult, checkpoint: Path) -> str:
    """The checkpoint's sha256 as the stage that wrote it recorded it (checked unchanged when it was
    taken from the cache), else computed."""
    from gptcore.tools.fingerprint import sha256_file

    return full.files.get(str(checkpoint)) or sha256_file(checkpoint)


def evaluate_fingerprint(params: PipelineParams, tokens: TokensResult, digest: str, device: str) -> str:
    import gptcore.data.batches
    import gptcore.eval.held_out
    import gptcore.generate
    import gptcore.model.gpt
    import gptcore.train.validate

    code = code_version_of(
        gptcore.eval.held_out,
        gptcore.generate,
        gptcore.train.validate,
        gptcore.model.gpt,
        gptcore.data.batches,
    )
    return fingerprint(
        "evaluate",
        digest,
        tokens.files.get(tokens.test),
        tokens.files.get(tokens.train),  # the unigram baseline's counts
        params.evaluate.model_dump(),
        device,
        code,
        *benchmark_identity(params),
    )


def benchmark_identity(params: PipelineParams) -> tuple[str, ...]:
    """What the benchmarks' scores depend on besides the model: the harness's version and the files of
    the tasks' own folder (a changed YAML or data file scores anew). Nothing when none is listed."""
    if not params.evaluate.benchmarks:
        return ()
    from importlib.metadata import version

    from gptcore.eval.benchmarks import task_files_digest

    include = params.evaluate.benchmark_include_path
    return (version("lm_eval"), task_files_digest(Path(include)) if include else "")


@stage_task("evaluate")
def evaluate_task(
    fingerprint: str, params: PipelineParams, tokens: TokensResult, checkpoint: str, device: str
) -> EvaluateResult:
    """Test loss, perplexity and bits per byte of the checkpoint, beside the unigram baseline; samples.
    Computed holding the device's slot (`tasks.device_slot`), as training does."""
    from gptcore.eval.held_out import evaluate_held_out
    from tasks.device_slot import device_slot

    with device_slot(device, announce=announce):  # alone on the device: no training beside it
        record = evaluate_held_out(
            Path(checkpoint),
            Path(tokens.train),
            Path(tokens.test),
            Path(tokens.tokenizer_path),
            params.evaluate,
            device,
        )
        scores = _benchmarks(params, Path(checkpoint), Path(tokens.tokenizer_path), device)
    folder = run_directory(params, "evaluate", fingerprint)
    folder.mkdir(parents=True, exist_ok=True)
    evaluation = write_json_atomic(folder / EVALUATION_FILE, record.to_dict())
    samples = write_text_atomic(folder / SAMPLES_FILE, record.samples_markdown())
    written = [evaluation, samples]
    if scores is not None:
        written.append(write_json_atomic(folder / BENCHMARKS_FILE, scores.to_dict()))
    figures = {name: getattr(record, name) for name in _FIGURES}
    figures.update(scores.figures() if scores is not None else {})
    if record.samples:
        first = record.samples[0]
        figures["sample"] = " ".join(f"{first.prompt}⟶{first.greedy}".split())[:160]
    bits = record.test_bits_per_byte or float("nan")
    announce(
        f"evaluate: test loss {record.test_loss:.4f} ({bits:.4f} bits/byte) against the unigram "
        f"{record.unigram_test_loss:.4f}; samples in {samples}"
    )
    return EvaluateResult(
        fingerprint=fingerprint,
        checkpoint=checkpoint,
        evaluation=record.to_dict(),
        benchmarks=scores.to_dict() if scores is not None else {},
        files=file_record(*written),
        outputs=[str(path) for path in written],
        figures=figures,
    )


def benchmark_gate(params: PipelineParams, result: EvaluateResult) -> BenchmarkGate | None:
    """`evaluate.benchmark_gate` with this evaluation's figure (None: no gate); a figure the task did not
    produce is a ConfigError naming those it did."""
    figure = params.evaluate.benchmark_gate
    if figure is None:
        return None
    from gptcore.eval.benchmarks import BenchmarkScores
    from tasks.tracking.models.gate import BenchmarkGate

    scores = BenchmarkScores.from_dict(result.benchmarks)
    task, _, metric = figure.partition("/")
    if figure not in scores.figures():
        produced = ", ".join(scores.tasks.get(task, {})) or "none"
        raise ConfigError(
            f"evaluate.benchmark_gate {figure}: {task} gave no {metric} (its figures: {produced}); "
            f"name one of them as {task}/<metric>"
        )
    return BenchmarkGate(figure, scores.figures()[figure], scores.better_when_higher(figure))


def _benchmarks(
    params: PipelineParams, checkpoint: Path, tokenizer: Path, device: str
) -> BenchmarkScores | None:
    """The checkpoint scored on `evaluate.benchmarks` by lm-evaluation-harness (None: none listed)."""
    if not params.evaluate.benchmarks:
        return None
    from gptcore.checkpoint.load import load_model
    from gptcore.eval.benchmarks import is_headline, requests_for, run_benchmarks

    model, _ = load_model(checkpoint)
    scores = run_benchmarks(model, tokenizer, requests_for(params.evaluate, device))
    shown = ", ".join(f"{name} {value:.4g}" for name, value in scores.figures().items() if is_headline(name))
    announce(f"evaluate: benchmarks (lm-evaluation-harness): {shown}")
    return scores
