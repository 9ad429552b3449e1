"""A run's report as data: its stages in order, each with its state, outputs and figures; what
`gptpipe run` prints as its last JSON line, a flow returns, a sweep reads back from a trial and the closing
lines put in words."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from gptcore.tools.records import JSONObject
from tasks.results import Figure


class StageLine(BaseModel):
    """One stage as the run's report says it: its entry of the JSON line, read back by a sweep."""

    model_config = ConfigDict(frozen=True)

    name: str
    state: str  # completed | cached | failed | skipped
    outputs: list[str] = []
    figures: dict[str, Figure] = {}
    seconds: float = 0.0
    message: str | None = None  # why it failed or was skipped (none: it ran)

    @property
    def done(self) -> bool:
        return self.state in ("completed", "cached")


class RunReport(BaseModel):
    """A run's stages in order: what `gptpipe run` prints as its last JSON line and a flow returns."""

    model_config = ConfigDict(frozen=True)

    stages: list[StageLine]

    def stage(self, name: str) -> StageLine | None:
        return next((stage for stage in self.stages if stage.name == name), None)

    def figure(self, stage: str, name: str) -> Figure:
        found = self.stage(stage)
        return found.figures.get(name) if found is not None else None

    def headline(self) -> dict[str, float]:
        """The figures a run is compared by that its stages produced: HEADLINE's, and the evaluate
        stage's benchmark metrics (`hellaswag/acc_norm`; not their stderr or sample count)."""
        from gptcore.eval.benchmarks import is_headline

        found: dict[str, float] = {}
        for stage in self.stages:
            scored = stage.name == "evaluate"
            benchmarks = [name for name in stage.figures if is_headline(name)] if scored else []
            for name in [*HEADLINE.get(stage.name, ()), *benchmarks]:
                value = stage.figures.get(name)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    found[name] = float(value)
        return found

    def to_dict(self) -> JSONObject:
        """The JSON a flow returns and prints (a stage's message only where it has one)."""
        return self.model_dump(exclude_none=True)


# The figures a pipeline run is compared by, per stage: logged on the run itself and a sweep's columns.
HEADLINE = {
    "evaluate": ("test_bits_per_byte", "test_perplexity"),
    # and what a scaling study reads of a run (flows.scale): its size, its tokens and its FLOPs
    "full": (
        "final_val_loss",
        "tokens_per_second",
        "parameter_count",
        "non_embedding_parameter_count",
        "tokens_seen",
        "training_flops",
        "tokens_per_step",
    ),
    "finetune": ("final_val_loss", "tokens_per_second"),
    "before-after": ("base_test_bits_per_byte_after",),  # what a fine-tune forgot
}
