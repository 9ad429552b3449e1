"""One training run's settings: its optimizer, its budget and its cadence (`gptcore.train.trainer`)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from gptcore.model.size import ModelSize
from gptcore.tools.strict import Strict

# The fields of the optimizer's choice: an AdamW run's identity leaves them out, as before they existed.
MUON_FIELDS = ("name", "muon_learning_rate", "muon_momentum")
# The compute budgets: a run's identity holds them only when set, so runs from before them keep their keys.
BUDGET_FIELDS = ("max_flops", "tokens_per_parameter")


class OptimizerConfig(Strict):
    """AdamW, or Muon for the blocks' matrices beside AdamW for the rest (`gptcore.train.muon`), with
    warmup then cosine decay (`gptcore.train.schedule`), and gradient clipping."""

    name: Literal["adamw", "muon"] = Field(
        default="adamw",
        description="adamw: every weight; muon: torch.optim.Muon for the 2-D weights inside the blocks, "
        "AdamW (learning_rate, betas, weight_decay) for embeddings, head, norms and biases",
    )
    muon_learning_rate: float = Field(
        default=0.02,
        gt=0.0,
        le=10.0,
        description="Muon's peak rate (muon only); the schedule scales it as AdamW's",
    )
    muon_momentum: float = Field(
        default=0.95, ge=0.0, lt=1.0, description="Muon's Nesterov momentum (muon only)"
    )

    learning_rate: float = Field(default=1e-3, gt=0.0, le=10.0, description="the peak, after warmup")
    min_learning_rate: float = Field(default=1e-4, ge=0.0, le=10.0, description="the cosine decay's floor")
    warmup_steps: int = Field(default=20, ge=0, description="optimizer steps of linear warmup")
    warmup_share: float | None = Field(
        default=None,
        gt=0.0,
        lt=1.0,
        description="warmup as a share of the run's steps instead (a scaling study's runs: every length "
        "the same schedule's shape); set, it replaces warmup_steps",
    )
    weight_decay: float = Field(default=0.1, ge=0.0, description="on matrices; biases and norms get none")
    beta1: float = Field(default=0.9, ge=0.0, lt=1.0, description="AdamW's first-moment decay")
    beta2: float = Field(default=0.95, ge=0.0, lt=1.0, description="AdamW's second-moment decay")
    grad_clip: float = Field(
        default=1.0, ge=0.0, description="the gradient's largest norm; 0 turns clipping off"
    )

    def scaled(self, factor: float) -> OptimizerConfig:
        """These settings with the AdamW rates (peak and floor) multiplied by `factor` (the size dial's
        width rule); Muon's rate is its own."""
        rates = {
            "learning_rate": self.learning_rate * factor,
            "min_learning_rate": self.min_learning_rate * factor,
        }
        return self.model_copy(update={key: float(f"{value:.4g}") for key, value in rates.items()})

    def identity(self) -> dict[str, object]:
        """What decides the trajectory, as cache keys and a resume's check read it: every field; an AdamW
        run's without Muon's (as before Muon could be chosen, so its caches and checkpoints hold)."""
        dumped = self.model_dump(exclude={"warmup_share"} if self.warmup_share is None else set())
        return dumped if self.name == "muon" else {k: v for k, v in dumped.items() if k not in MUON_FIELDS}

    def warmup_for(self, steps: int) -> int:
        """The warmup of a run of `steps`: warmup_share of them (at least one) or warmup_steps, always
        leaving a step to decay."""
        wanted = (
            max(1, round(self.warmup_share * steps)) if self.warmup_share is not None else self.warmup_steps
        )
        return min(wanted, max(0, steps - 1))


class TrainingConfig(Strict):
    """One training run's budget and cadence."""

    epochs: int = Field(default=1, ge=1, description="passes over the training examples")
    max_steps: int | None = Field(default=None, ge=1, description="optimizer steps; caps epochs")
    max_tokens: int | None = Field(
        default=None,
        ge=1,
        description="tokens to train on (every step's inputs), rounded up to whole steps; caps epochs",
    )
    max_flops: float | None = Field(
        default=None,
        gt=0,
        description="a compute budget: training FLOPs (6N plus attention a token, gptcore.model.size), "
        "rounded up to whole steps; caps epochs",
    )
    tokens_per_parameter: float | None = Field(
        default=None,
        gt=0,
        description="a budget of tokens per parameter (Chinchilla's compute-optimal is about 20): this "
        "times the parameter count, rounded up to whole steps; caps epochs",
    )
    training_examples: int | None = Field(default=None, ge=1, description="the first N training windows only")
    validation_examples: int | None = Field(
        default=None, ge=1, description="the first N validation windows only"
    )
    log_every: int = Field(default=10, ge=1, description="steps between train-loss records")
    eval_every: int = Field(default=100, ge=1, description="steps between validations")
    checkpoint_every: int = Field(default=100, ge=1, description="steps between periodic checkpoints")
    keep_last: int = Field(default=2, ge=1, description="periodic checkpoints kept (best and final besides)")
    async_checkpoints: bool = Field(
        default=True, description="write checkpoints on a background thread: the loop waits for a copy only"
    )
    max_skipped_steps: int = Field(default=25, ge=1, description="fp16: consecutive overflow skips that stop")
    eval_at_start: bool = Field(
        default=False, description="evaluate before the first step: the baseline later ones are judged by"
    )
    seed: int = Field(default=1337, description="initial weights, dropout and the examples' order")
    optimizer: OptimizerConfig = Field(
        default=OptimizerConfig(), description="the optimizer and its schedule"
    )

    def identity(self, exclude: frozenset[str] = frozenset()) -> dict[str, object]:
        """The settings as cache keys and a resume's check read them: the optimizer's `identity()`;
        without the fields in `exclude` (a section's own, keyed elsewhere)."""
        unset_budgets = {key for key in BUDGET_FIELDS if getattr(self, key) is None}
        dumped = self.model_dump(exclude=set(exclude) | unset_budgets)  # unset: keys as before budgets
        if self.optimizer is not None:
            dumped["optimizer"] = self.optimizer.identity()
        return dumped

    def token_budget(self, size: ModelSize) -> int | None:
        """The tokens this run may train on at `size`: the least of max_tokens and what max_flops and
        tokens_per_parameter buy (None: no budget but the steps and epochs)."""
        budgets = [
            self.max_tokens,
            size.tokens_for(self.max_flops) if self.max_flops is not None else None,
            math.ceil(self.tokens_per_parameter * size.parameter_count)
            if self.tokens_per_parameter is not None
            else None,
        ]
        return min((budget for budget in budgets if budget is not None), default=None)

    @classmethod
    def of(cls, section: TrainingConfig) -> TrainingConfig:
        """These settings of a section that extends them (a pipeline stage's, with fields of its own):
        what the trainer reads, and nothing it does not know."""
        return cls.model_validate(section.model_dump(include=set(cls.model_fields)))

    # What a run of `steps` optimizer steps does, counted from these settings by the trainer's own rules
    # (a log line every `log_every` steps and at the last; an evaluation, or a periodic checkpoint, every
    # `every` steps before the last, which always evaluates and writes `final`).

    def logged_losses(self, steps: int) -> int:
        """Train losses the run logs."""
        return steps // self.log_every + int(steps % self.log_every != 0)

    def evaluations(self, steps: int) -> int:
        """Evaluations the run makes (given validation examples): the baseline, periodic ones, the last."""
        return int(self.eval_at_start) + (steps - 1) // self.eval_every + 1

    def periodic_checkpoints(self, steps: int) -> int:
        """Checkpoints the run writes every `checkpoint_every` steps (besides best and final)."""
        return (steps - 1) // self.checkpoint_every
