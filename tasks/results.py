"""What each pipeline stage hands to the next: one pydantic model per stage, read by attribute.

Every result names its output files with their sha256 (`files`: a cache hit is trusted only while they
are unchanged), the paths a person looks at (`outputs`) and the headline figures the report and MLflow
show (`figures`). Results are small: never tensors or datasets. A result cached by an older version of
the code (a plain dict with the same keys) validates into the same model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

from gptcore.runtime.batch_size import BatchChoice
from gptcore.runtime.decided import Runtime
from gptcore.runtime.device import DeviceReport
from gptcore.tools.fingerprint import sha256_file
from gptcore.train.records import SummaryRecord
from tasks.params.schema import ModelProfile


class StageResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    fingerprint: str | None = None  # what determined the outputs (None: a stage that is never cached)
    files: dict[str, str] = {}  # output path -> sha256
    outputs: list[str] = []
    figures: dict[str, Any] = {}

    def stale_outputs(self) -> list[str]:
        """Output files that are missing or whose content changed since the stage wrote them."""
        return [path for path, digest in self.files.items() if not _unchanged(path, digest)]


def _unchanged(path: str, digest: str) -> bool:
    return Path(path).is_file() and sha256_file(path) == digest


def file_record(*paths: str | Path) -> dict[str, str]:
    """The `files` of a result: each output path with its content hash."""
    return {str(path): sha256_file(path) for path in paths}


class TokenizerResult(StageResult):
    tokenizer: dict[str, Any]  # gptcore.data.tokenizer.TokenizerManifest.to_dict()
    corpus: dict[str, Any]  # gptcore.data.corpus.Corpus.to_dict(): fingerprint, source, split statistics


class TokensResult(StageResult):
    tokens: dict[str, Any]  # gptcore.data.build.TokenFolderManifest.to_dict()
    train: str  # the token files the training stages read
    validation: str
    test: str  # held out: read by the evaluate stage alone
    tokenizer_path: str


class DeviceResult(StageResult):
    device: DeviceReport  # the machine's facts and its precision probe
    runtime: Runtime  # the decided runtime: what the training stages train with


class SmokeResult(StageResult):
    gate: dict[str, Any]  # tasks.stages.smoke_gate.GateResult.to_dict()
    optimizer: dict[str, Any]  # the settings it trained with and their source (full or smoke)
    schedule: dict[str, Any]  # the full run's steps and warmup it followed
    precision: str
    val_losses: list[float]
    summary: SummaryRecord  # the trainer's
    full_planned_steps: int
    estimated_full_seconds: float
    estimate: dict[str, Any] | None = None  # gptcore.train.estimate.RunTimeEstimate.figures(): its parts
    # tasks.stages.smoke_gate.DataSizing: tokens per parameter of the full run and of the train split.
    data_sizing: dict[str, Any] = {}
    # The batch it trained with: full training reuses it (`batch_size: auto`). None: a result cached
    # before the smoke stage recorded it (`{}` then).
    batch: BatchChoice | None = None

    @field_validator("batch", mode="before")
    @classmethod
    def _none_when_empty(cls, value: Any) -> Any:
        return value or None


class CheckpointsResult(StageResult):
    """A stage whose outputs are checkpoints of plain models, in `run_directory`: the stages after
    training read them (`tasks.stages.evaluate.evaluated_checkpoint`)."""

    run_directory: str


class FullResult(CheckpointsResult):
    summary: SummaryRecord


class MergeResult(CheckpointsResult):
    """A fine-tune's checkpoints as plain models: a LoRA run's merged into `<run>/merged` (its adapters
    alone in `adapter`), a full fine-tune's as trained (`merged` false: nothing to merge)."""

    merged: bool
    checkpoints: list[str]  # the plain checkpoints (final, best): merged, or as trained
    adapter: str | None = None  # adapter.safetensors, beside it adapter_config.json


class EvaluateResult(StageResult):
    checkpoint: str  # the checkpoint evaluated
    evaluation: dict[str, Any]  # gptcore.eval.held_out.HeldOutRecord.to_dict(): figures and samples
    benchmarks: dict[str, Any] = {}  # gptcore.eval.benchmarks.BenchmarkScores.to_dict() (none: empty)


class ExportResult(StageResult):
    folder: str  # the Hugging Face folder
    checkpoint: str  # the checkpoint exported


class QuantizeResult(StageResult):
    checkpoint: str  # the checkpoint quantized (the evaluated one)
    rows: list[dict[str, Any]]  # gptcore.eval.quant_tradeoff.TradeoffRow.to_dict(), fp32 first
    machine: dict[str, Any]  # gptcore.model.quantization.cpu_features()
    model_folders: dict[str, str]  # method -> the folder of its model files (measured methods)


class BaseResult(StageResult):
    uri: str  # finetune.model as given
    lineage: dict[str, str]  # base_model_uri, base_registered_model, base_model_version, ...
    folder: str  # the base's model files, kept under <data_root>/base-models
    weights_sha256: str
    model: ModelProfile  # what training builds: the base's own architecture (start_model.start_profile)
    tokenizer: dict[str, Any]  # the base's tokenizer over the new corpus (a TokenizerManifest.to_dict())
    base_test_tokens: str | None = None  # the base corpus's test split (None: not found)

    def tokenizer_result(self) -> TokenizerResult:
        """The base's tokenizer as the tokens stage takes a trained one."""
        path = self.tokenizer["path"]
        return TokenizerResult(
            fingerprint=self.tokenizer["fingerprint"],
            tokenizer=self.tokenizer,
            corpus={"fingerprint": self.tokenizer["corpus_fingerprint"]},
            files={path: self.tokenizer["sha256"]},
            outputs=[path],
        )


class BeforeAfterResult(StageResult):
    pass  # its figures: new_test_* and base_test_* bits per byte and loss, _before and _after
