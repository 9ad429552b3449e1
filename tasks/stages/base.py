"""The base stage: the model training starts from, resolved and checked every time (an alias may have
moved) and kept once (`tasks.stages.start_model`): a fine-tune's base (`tasks.stages.finetune`), or, as
the `tokenizer` stage of continued pretraining, `full.init_from`'s model. What it hands on is typed: the
`TrainingStart` (`BaseResult.start`), its tokenizer (`BaseResult.tokenizer_result`), its lineage tags."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gptcore.errors import ConfigError
from tasks.caching import StageOutcome
from tasks.stage import Stage, announce
from tasks.stages.finetune import resolve_base
from tasks.stages.start_model import BaseResult, resolve_start, start_model

if TYPE_CHECKING:
    from tasks.tracking import PipelineRecorder


@dataclass(frozen=True, kw_only=True)
class Base(Stage[BaseResult]):
    """The model training starts from, resolved and checked every time (an alias may have moved): a
    fine-tune's base, or, as the `tokenizer` stage of continued pretraining, `full.init_from`'s model."""

    result_type = BaseResult
    cached = False
    name: str = "base"

    def key(self) -> tuple[Any, ...]:
        return ()  # never cached: a model URI may name another version tomorrow

    def compute(self, fingerprint: str | None) -> BaseResult:
        if self.params.finetune is not None:
            return resolve_base(self.params)
        start = start_model(self.params)
        if start is None:
            raise ConfigError("full.init_from: none named, so training starts from random weights")
        result = resolve_start(self.params, start)
        announce(
            f"{self.name}: {result.uri}'s tokenizer encodes the corpus; training starts from its weights"
        )
        return result

    def record(self, outcome: StageOutcome, tracking: PipelineRecorder) -> StageOutcome:
        """Recorded, and the model it builds as the flow's run params when the file named none."""
        tracking.record_stage(outcome)
        if self.params.model is None and isinstance(outcome.result, BaseResult):
            tracking.log_params(outcome.result.model.as_params())
        return outcome
