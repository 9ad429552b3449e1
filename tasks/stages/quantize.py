"""The quantize stage: the evaluated checkpoint through each of `quantize.methods`, one row of a
size / quality / speed trade-off table per method beside fp32 (`gptcore.eval.quant_tradeoff`); cached on
the checkpoint's content hash, the test token file's, the settings and the code. Recorded by registering
each measured method's model (`tasks.tracking.models.quantized`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gptcore.eval.quant_tradeoff import TradeoffRow
from tasks.caching import StageOutcome
from tasks.results import Figure, Record, StageResult, file_record
from tasks.stage import announce
from tasks.stages.device import DeviceResult
from tasks.stages.evaluate import AfterEvaluation
from tasks.stages.training import run_directory

if TYPE_CHECKING:
    from gptcore.data.tokenfile import TokenStream
    from gptcore.eval.config import EvaluateConfig, QuantizeConfig
    from gptcore.model.gpt import GPT
    from tasks.tracking import PipelineRecorder

log = logging.getLogger(__name__)
# The figures of each measured method that the stage's summary shows (all of them are in the table).
HEADLINE = ("size_ratio", "test_perplexity_change", "greedy_agreement", "generate_tokens_per_second")


class QuantizeResult(StageResult):
    checkpoint: str  # the checkpoint quantized (the evaluated one)
    rows: list[Record[TradeoffRow]]  # fp32 first
    machine: dict[str, Any]  # gptcore.model.quantization.cpu_features(): the machine's free-form facts
    model_folders: dict[str, str]  # method -> the folder of its model files (measured methods)


@dataclass(frozen=True, kw_only=True)
class Quantize(AfterEvaluation[QuantizeResult]):
    """Each method's quantized model files and its row of the trade-off table, measured holding the
    device's slot (`tasks.device_slot`): generation speed beside a training is no figure."""

    result_type = QuantizeResult
    name: str = "quantize"
    device: DeviceResult

    def key(self) -> tuple[Any, ...]:
        params, tokens = self.params, self.tokens
        prompts = params.evaluate.model_dump(include={"prompts", "prompt_tokens"})
        test = tokens.files.get(tokens.test)
        return (
            "quantize",
            self.read.digest,
            test,
            params.quantize.model_dump(),
            prompts,
            self.device.runtime.device,
        )

    def skip_reason(self) -> str | None:
        return None if self.params.quantize.methods else "quantize.methods is empty in the parameter file"

    def compute(self, fingerprint: str | None) -> QuantizeResult:
        from gptcore.checkpoint.load import load_model
        from gptcore.data.tokenfile import open_tokens
        from gptcore.export.model_files import model_files_in
        from tasks.device_slot import device_slot

        params, device = self.params, self.device.runtime.device
        folder = run_directory(params, "quantize", fingerprint)
        with device_slot(device, announce=announce):  # its speed columns are measured alone on the device
            model, _ = load_model(self.read.checkpoint, device)
            test, tokenizer = open_tokens(Path(self.tokens.test)), Path(self.tokens.tokenizer_path)
            methods = list(params.quantize.methods)
            measured = measure_quantized(
                model, methods, test, tokenizer, params.quantize, params.evaluate, folder, device
            )
        rows, written = measured.rows, measured.written
        # The weights guard the cache (a hit whose weights are gone or changed runs again); the stage run
        # logs the .json and .md files of `files`, which are the tables alone this way.
        weights = [model_files_in(Path(place)).weights for place in measured.model_folders.values()]
        _publish_table(rows, params.iteration)
        announce(f"quantize: the trade-off of {len(rows)} methods in {written[1]}\n{measured.table()}")
        figures: dict[str, Figure] = {}
        for row in rows:
            if not row.measured:
                figures[f"{row.method}/status"] = row.status
                continue
            figures.update({f"{row.method}/{name}": getattr(row, name) for name in HEADLINE})
        return QuantizeResult(
            fingerprint=fingerprint,
            checkpoint=str(self.read.checkpoint),
            rows=rows,
            machine=measured.machine,
            model_folders=measured.model_folders,
            files=file_record(*written, *weights),
            outputs=[str(path) for path in written],
            figures=figures,
        )

    def record(self, outcome: StageOutcome, tracking: PipelineRecorder) -> StageOutcome:
        """Each measured method's model registered (its version and alias among the figures)."""
        from tasks.tracking.models.registry import registered_name
        from tasks.tracking.models.test_split import split_tags

        result = outcome.result
        if isinstance(result, QuantizeResult):
            registrations = tracking.record_quantized(
                registered_name(self.params), result, self.read.digest,
                self.params.quantize.may_hold_champion, split_tags(self.tokens.test),
            )  # fmt: skip
            figures = dict(outcome.figures)
            for method, registration in registrations.items():
                if registration is not None:
                    figures[f"{method}/model_version"] = registration.model_version
                    figures[f"{method}/alias"] = registration.alias
            outcome.result = result.model_copy(update={"figures": figures})
        tracking.record_stage(outcome)
        return outcome


@dataclass(frozen=True)
class Tradeoff:
    """A model measured through quantization methods (`measure_quantized`): the table's rows, fp32 first;
    the machine they were measured on; the files the table was written as (tradeoff.json, tradeoff.md);
    each measured method's folder of model files."""

    rows: list[TradeoffRow]
    machine: dict[str, Any]  # gptcore.model.quantization.cpu_features()
    written: list[Path]
    model_folders: dict[str, str]  # method -> its folder

    def table(self) -> str:
        """The table as a person reads it (Markdown, the machine below it)."""
        from gptcore.eval.quant_tradeoff import tradeoff_markdown

        return tradeoff_markdown(self.rows, self.machine)


def measure_quantized(
    model: GPT,
    methods: list[str],
    test: TokenStream,
    tokenizer: Path,
    settings: QuantizeConfig,
    prompts: EvaluateConfig,
    folder: Path,
    device: str = "cpu",
) -> Tradeoff:
    """What the quantize stage and `gptpipe quantize` both do: `model` through each of `methods` on the
    `test` stream, a row per method beside fp32, each quantized model's files in `folder/<method>` and the
    table (with the machine's facts) in `folder`."""
    from gptcore.eval.quant_tradeoff import measure_tradeoff, write_tradeoff
    from gptcore.model.quantization import cpu_features

    rows = measure_tradeoff(model, methods, test, tokenizer, settings, prompts, folder, device)
    machine = cpu_features()
    written = write_tradeoff(rows, machine, folder)
    model_folders = {row.method: str(folder / row.method) for row in rows if row.measured}
    return Tradeoff(rows, machine, written, model_folders)


def _publish_table(rows: list[TradeoffRow], iteration: int) -> None:
    """The table as a Prefect table artifact: a convenience, never a reason to fail the stage."""
    try:
        from prefect.artifacts import create_table_artifact

        create_table_artifact(
            [{key: value for key, value in row.to_dict().items() if value is not None} for row in rows],
            key=f"gptpipe-iteration-{iteration}-quantization",
            description="size, quality and speed of each quantization method beside fp32",
        )
    except Exception as error:
        log.warning("quantization table artifact not created: %s", error)
