"""The export stage: the evaluated checkpoint as a Hugging Face folder (`export.hf: true`): GPT-2's
layout, or Llama's / Qwen3's for the modern recipe; cached on the checkpoint's content hash and the
export code."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gptcore.export.card import CardFacts
from tasks.results import StageResult, file_record
from tasks.stage import announce
from tasks.stages.evaluate import AfterEvaluation
from tasks.stages.training import run_directory

if TYPE_CHECKING:
    import torch

    from gptcore.finetune.config import LoRAConfig
    from gptcore.model.config import ModelConfig
    from gptcore.model.gpt import GPT


class ExportResult(StageResult):
    folder: str  # the Hugging Face folder
    checkpoint: str  # the checkpoint exported


@dataclass(frozen=True, kw_only=True)
class Export(AfterEvaluation[ExportResult]):
    """Write the Hugging Face folder of the evaluated checkpoint with the tokenizer its token files were
    made with."""

    result_type = ExportResult
    name: str = "export"

    def key(self) -> tuple[Any, ...]:
        return ("export-hf", self.read.digest)

    def skip_reason(self) -> str | None:
        return None if self.params.export.hf else "export.hf is off in the parameter file"

    def compute(self, fingerprint: str | None) -> ExportResult:
        into = run_directory(self.params, "export-hf", fingerprint)
        tokenizer = Path(self.tokens.tokenizer_path)
        folder = export_checkpoint(self.read.checkpoint, into, tokenizer, force=True, facts=self.card_facts())
        files = sorted(path for path in folder.iterdir() if path.is_file())
        announce(f"export: a Hugging Face folder in {folder}")
        return ExportResult(
            fingerprint=fingerprint,
            folder=str(folder),
            checkpoint=str(self.read.checkpoint),
            files=file_record(*files),
            outputs=[str(folder)],
            figures={"format": "hf", "files": len(files)},
        )

    def card_facts(self) -> CardFacts:
        """The model card's facts from this run's records: the evaluation, the test split, the corpus."""
        from gptcore.data.corpus import describe
        from tasks.tracking.models.registry import registered_name
        from tasks.tracking.models.test_split import TEST_SPLIT, split_tags

        held_out = self.evaluated.evaluation
        facts: dict[str, str | int | float] = {"iteration": self.params.iteration, "step": held_out.step}
        facts |= {key: value for key, value in self.trained.figures.items() if key in CARD_FIGURES}
        return CardFacts(
            name=registered_name(self.params),
            test_bits_per_byte=held_out.test_bits_per_byte,
            test_loss=held_out.test_loss,
            test_split=split_tags(self.tokens.test).get(TEST_SPLIT),
            dataset=describe(self.params.corpus),
            facts=facts,
        )


# The training figures a model card lists (their MLflow names), where the run recorded them.
CARD_FIGURES = (
    "parameter_count",
    "steps",
    "tokens_seen",
    "training_flops",
    "final_val_loss",
    "elapsed_seconds",
)


def export_checkpoint(
    checkpoint: Path,
    output: Path,
    tokenizer: Path | None = None,
    force: bool = False,
    facts: CardFacts | None = None,
    part: str = "hf",
) -> Path:
    """What the export stage and `gptpipe export` both do with a checkpoint: `part` of it (`export_part`)
    in `output` with `tokenizer` (default: the one the checkpoint names) and a model card of `facts`
    (default: what the checkpoint's record says); the folder. The adapter (`peft`) is taken from an
    adapted checkpoint or one merged from it; a model (`hf`, `hf-base`) from a plain or merged one."""
    from gptcore.checkpoint.load import load_model
    from gptcore.checkpoint.merge import adapter_of
    from gptcore.export.model_files import checkpoint_tokenizer

    adapter = None
    if part != "hf":
        weights, settings, record = adapter_of(checkpoint)
        adapter = (weights, settings)
    if part == "peft":
        return export_part(part, record.architecture(checkpoint), adapter, None, output, force, None)
    model, record = load_model(checkpoint)
    if facts is None:
        said = {"step": record.step, "val_loss": record.val_loss}
        facts = CardFacts(name=Path(output).name, facts={k: v for k, v in said.items() if v is not None})
    tokenizer = Path(tokenizer or checkpoint_tokenizer(record))
    return export_part(part, model, adapter, tokenizer, output, force, facts)


def export_part(
    part: str,
    model: GPT | ModelConfig,
    adapter: tuple[dict[str, torch.Tensor], LoRAConfig] | None,
    tokenizer: Path | None,
    output: Path,
    force: bool,
    facts: CardFacts | None,
) -> Path:
    """`part` of a model in `output`: `hf` the model itself as a Hugging Face folder; `peft` its `adapter`
    alone in PEFT's format (`model` may be just its config); `hf-base` the base the adapter applies to
    (the model less the adapter's updates: `gptcore.finetune.lora.unmerge_lora`) as a Hugging Face
    folder."""
    from gptcore.export.hf import export_hf
    from gptcore.finetune.lora import unmerge_lora
    from gptcore.finetune.peft import write_peft_adapter
    from gptcore.model.config import ModelConfig
    from gptcore.model.gpt import GPT

    if part == "peft" and adapter is not None:
        config = model if isinstance(model, ModelConfig) else model.config
        return write_peft_adapter(*adapter, config, output, force=force)
    assert isinstance(model, GPT) and tokenizer is not None  # the Hugging Face folders need the weights
    if part == "hf-base" and adapter is not None:
        model = unmerge_lora(copy.deepcopy(model), *adapter)
        facts = None  # the fine-tune's figures are not the base's: its card says what the model itself does
    return export_hf(model, tokenizer, output, force=force, facts=facts)
