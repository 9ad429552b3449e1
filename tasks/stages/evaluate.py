"""The evaluate stage: the trained run's chosen checkpoint measured on the held-out test split, its
samples, and its scores on the standard benchmarks the parameter file lists (lm-evaluation-harness);
cached on the checkpoint's content hash, the test token file's, the settings and the benchmark tasks' own
files. Recorded by registering the checkpoint as a version of the iteration's model (champion or
challenger, on this test split)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from gptcore.errors import ConfigError
from gptcore.eval.benchmarks import BenchmarkScores
from gptcore.eval.held_out import HeldOutRecord
from gptcore.tools.atomic import write_json_atomic, write_text_atomic
from tasks.caching import StageOutcome
from tasks.results import CheckpointsResult, Figure, Record, StageResult, file_record
from tasks.stage import Stage, announce
from tasks.stages.device import DeviceResult
from tasks.stages.reading import ReadCheckpoint
from tasks.stages.tokens import SplitsResult
from tasks.stages.training import run_directory

if TYPE_CHECKING:
    from tasks.params.schema import PipelineParams, PredictionConfig
    from tasks.tracking import PipelineRecorder
    from tasks.tracking.models.gate import BenchmarkGate

R = TypeVar("R", bound=StageResult)
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


class EvaluateResult(StageResult):
    checkpoint: str  # the checkpoint evaluated
    evaluation: Record[HeldOutRecord]  # figures and samples
    benchmarks: Record[BenchmarkScores] = BenchmarkScores({}, {})  # none listed: empty


@dataclass(frozen=True, kw_only=True)
class Evaluate(Stage[EvaluateResult]):
    """Test loss, perplexity and bits per byte of the checkpoint, beside the unigram baseline; samples;
    computed holding the device's slot (`tasks.device_slot`), as training does."""

    result_type = EvaluateResult
    name: str = "evaluate"
    tokens: SplitsResult
    device: DeviceResult
    trained: CheckpointsResult  # the full stage's, or a fine-tune's merged checkpoints
    lineage: dict[str, str] | None = None  # the tags of a version trained from a start model

    @cached_property
    def read(self) -> ReadCheckpoint:
        return ReadCheckpoint.evaluated(self.params, self.trained)

    def key(self) -> tuple[Any, ...]:
        tokens = self.tokens
        return (
            "evaluate",
            self.read.digest,
            tokens.files.get(tokens.test),
            tokens.files.get(tokens.train),  # the unigram baseline's counts
            self.params.evaluate.model_dump(),
            self.device.runtime.device,
            *benchmark_identity(self.params),
            *([self.params.prediction.model_dump()] if self.params.prediction else []),
        )

    def compute(self, fingerprint: str | None) -> EvaluateResult:
        from gptcore.eval.held_out import evaluate_held_out
        from tasks.device_slot import device_slot

        params, tokens, device = self.params, self.tokens, self.device.runtime.device
        checkpoint, tokenizer = self.read.checkpoint, Path(tokens.tokenizer_path)
        with device_slot(device, announce=announce):  # alone on the device: no training beside it
            record = evaluate_held_out(
                checkpoint, Path(tokens.train), Path(tokens.test), tokenizer, params.evaluate, device
            )
            scores = _benchmarks(params, checkpoint, tokenizer, device)
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
        figures.update(prediction_figures(params.prediction, bits))
        announce(
            f"evaluate: test loss {record.test_loss:.4f} ({bits:.4f} bits/byte) against the unigram "
            f"{record.unigram_test_loss:.4f}; samples in {samples}"
        )
        return EvaluateResult(
            fingerprint=fingerprint,
            checkpoint=str(checkpoint),
            evaluation=record,
            benchmarks=scores or BenchmarkScores({}, {}),
            files=file_record(*written),
            outputs=[str(path) for path in written],
            figures=figures,
        )

    def record(self, outcome: StageOutcome, tracking: PipelineRecorder) -> StageOutcome:
        """The checkpoint registered as a version (a fine-tune's with its lineage as tags), its figures
        joined by the registration's (version, alias)."""
        from tasks.tracking.models.registry import registered_name
        from tasks.tracking.models.test_split import split_tags

        result = outcome.result
        bits = outcome.figures.get("test_bits_per_byte")
        if isinstance(result, EvaluateResult) and isinstance(bits, float):
            name = registered_name(self.params)
            gate = benchmark_gate(self.params, result)
            registration = tracking.register_evaluated(
                name, self.read.checkpoint, self.read.digest, bits, self.lineage,
                result.benchmarks.figures(), gate, split_tags(self.tokens.test),
            )  # fmt: skip
            if registration is not None:
                if registration.not_compared:
                    announce(
                        f"evaluate: {name} version {registration.model_version}: {registration.not_compared}"
                    )
                figures = {**outcome.figures, **registration.figures()}
                outcome.result = result.model_copy(update={"figures": figures})
        tracking.record_stage(outcome)
        return outcome


def benchmark_identity(params: PipelineParams) -> tuple[str, ...]:
    """What the benchmarks' scores depend on besides the model: the harness's version and the files of
    the tasks' own folder (a changed YAML or data file scores anew). Nothing when none is listed."""
    if not params.evaluate.benchmarks:
        return ()
    from importlib.metadata import version

    from gptcore.eval.benchmarks import task_files_digest

    include = params.evaluate.benchmark_include_path
    return (version("lm_eval"), task_files_digest(Path(include)) if include else "")


def benchmark_gate(params: PipelineParams, result: EvaluateResult) -> BenchmarkGate | None:
    """`evaluate.benchmark_gate` with this evaluation's figure (None: no gate); a figure the task did not
    produce is a ConfigError naming those it did."""
    figure = params.evaluate.benchmark_gate
    if figure is None:
        return None
    from tasks.tracking.models.gate import BenchmarkGate

    scores = result.benchmarks
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


@dataclass(frozen=True, kw_only=True)
class AfterEvaluation(Stage[R]):
    """What a stage after the evaluate stage reads: the checkpoint it measured, of the trained (or merged)
    run, with the tokens it was measured on."""

    tokens: SplitsResult
    trained: CheckpointsResult
    evaluated: EvaluateResult

    @cached_property
    def read(self) -> ReadCheckpoint:
        return ReadCheckpoint.of(self.trained, Path(self.evaluated.checkpoint))


def prediction_figures(prediction: PredictionConfig | None, measured: float) -> dict[str, Figure]:
    """A planned run's measurement beside its scaling study's prediction: the prediction, the error
    (measured / predicted - 1) and whether the measurement fell inside the stated interval."""
    if prediction is None or not math.isfinite(measured):
        return {}
    return {
        "predicted_test_bits_per_byte": prediction.test_bits_per_byte,
        "prediction_error": measured / prediction.test_bits_per_byte - 1,
        "prediction_within_interval": float(prediction.low <= measured <= prediction.high),
    }
