"""The parameter file's schema: one iteration's pipeline, its stages' sections, sweeps, tracking, paths
and the fine-tune switch. gptcore's own configurations (model, runtime, data, training, LoRA,
evaluation) are its sections' types; this layer builds a run's from them (`tasks.params.jobs`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from gptcore.chat.config import ChatDataConfig
from gptcore.data.config import CorpusConfig, DataConfig, TokenizerConfig
from gptcore.errors import ConfigError
from gptcore.eval.config import EvaluateConfig, QuantizeConfig
from gptcore.finetune.config import LoRAConfig, QLoRAConfig
from gptcore.model import dial
from gptcore.model.config import ModelConfig
from gptcore.model.dial import Recipe
from gptcore.runtime.config import ConcreteDevice, DeviceDefaults, RuntimeConfig
from gptcore.tools.records import JSONObject
from gptcore.tools.strict import Strict
from gptcore.train.config import OptimizerConfig, TrainingConfig

TrainingStage = Literal["smoke", "full"]
STAGES = ("tokenizer", "tokens", "device", "smoke", "full", "evaluate", "export", "quantize")
# A fine-tune's stages (flows.finetune): the base model in place of a tokenizer, its training `finetune`,
# `merge` (LoRA's adapters folded into the weights), and the before/after measurement on the new
# corpus's test split and the base corpus's.
FINETUNE_STAGES = ("base", "tokens", "device", "smoke", "finetune", "merge", "evaluate", "before-after")
FinetuneMethod = Literal["qlora", "lora", "full"]
# What `compare` trains beside each method: QLoRA against the two it trades memory with.
_COMPARED: dict[str, list[FinetuneMethod]] = {"qlora": ["lora", "full"], "lora": ["full"], "full": ["lora"]}


class ModelProfile(Strict):
    """A model of `params/profiles/`: its architecture and what it runs with on each kind of device. The
    architecture is written out, or follows from the size dial (`depth`, `gptcore.model.dial`): then the
    architecture's given fields (vocab_size, block_size, dropout) are kept and the shape and recipe are
    the dial's, and the training's AdamW rates scale with the width (`learning_rate_scale`)."""

    name: str = Field(
        description="the profile's name, recorded as the model.profile param (a dial's: gpt2-d6)"
    )
    depth: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="the size dial: blocks; width 64 x depth, heads of 64, AdamW rates x sqrt(256 / width)",
    )
    recipe: Recipe | None = Field(
        default=None, description="with depth: gpt2 or modern (unset: the architecture's own, else gpt2)"
    )
    architecture: ModelConfig = Field(description="the GPT's shape")
    cpu: DeviceDefaults = Field(description="batch, precision and workers on the CPU")
    gpu: DeviceDefaults = Field(description="batch, precision and workers on an accelerator (CUDA, MPS)")

    @model_validator(mode="before")
    @classmethod
    def _shape_from_the_dial(cls, data: Any) -> Any:
        """A profile stated by depth: its architecture built by the dial over the given vocabulary and
        context (a profile's own, when `--set model.depth=` turns a named profile)."""
        if not isinstance(data, dict) or data.get("depth") is None:
            return data
        given = data.get("architecture") or {}
        given = given.model_dump() if isinstance(given, ModelConfig) else dict(given)
        missing = [key for key in ("vocab_size", "block_size") if key not in given]
        if missing:
            raise ValueError(f"depth: the dial needs architecture.{missing[0]} (the rest follows from depth)")
        recipe = data.get("recipe") or (
            dial.recipe_of(ModelConfig(**given)) if "n_layer" in given else "gpt2"
        )
        shape = dial.architecture(
            data["depth"], recipe, given["vocab_size"], given["block_size"], given.get("dropout", 0.0)
        )
        return data | {"name": data.get("name") or dial.name(data["depth"], recipe), "recipe": recipe,
                       "architecture": shape}  # fmt: skip

    def at_depth(self, depth: int) -> ModelConfig:
        """This profile's architecture turned to `depth` on the dial, as `--set model.depth=` would turn
        it (its recipe kept, its vocabulary and context too)."""
        shape = self.architecture
        recipe = self.recipe or dial.recipe_of(shape)
        return dial.architecture(depth, recipe, shape.vocab_size, shape.block_size, shape.dropout)

    def learning_rate_scale(self) -> float:
        """What the training's AdamW rates are multiplied by: the dial's rule at this depth, else 1."""
        return dial.learning_rate_scale(self.depth) if self.depth is not None else 1.0

    def as_params(self) -> dict[str, Any]:
        """The profile as `model.*` run params: its name, its recipe in a word, its depth on the dial
        (where it has one) and its architecture."""
        dialed = {"model.depth": self.depth} if self.depth is not None else {}
        return {"model.profile": self.name, "model.recipe": self.architecture.recipe_name(), **dialed} | {
            f"model.{key}": value for key, value in self.architecture.model_dump().items()
        }


class SmokeConfig(TrainingConfig):
    """A bounded run that proves the full run's configuration trains and fits, and measures throughput:
    the full run's first steps, with its optimizer and its learning-rate schedule (warmup included)."""

    max_steps: int | None = Field(default=20, ge=2, description="optimizer steps; caps epochs")
    log_every: int = Field(default=5, ge=1, description="steps between train-loss records")
    eval_every: int = Field(default=20, ge=1, description="steps between validations")
    checkpoint_every: int = Field(default=1000, ge=1, description="steps between periodic checkpoints")
    eval_at_start: bool = Field(
        default=True, description="the untrained model's validation, the gate's baseline"
    )
    optimizer: OptimizerConfig | None = Field(  # type: ignore[assignment]
        default=None,
        description="unset: the full section's, so the smoke proves that configuration; set it to try "
        "another on purpose",
    )

    @model_validator(mode="after")
    def _gate_can_judge(self) -> SmokeConfig:
        """The gate compares the first and last train losses and validation losses: a run that cannot
        log two of each is refused now, not after the stages before it ran."""
        if self.max_steps is None:  # epochs decide: the length is known only with the data
            return self
        logged = self.logged_losses(self.max_steps)
        if logged < 2:
            raise ValueError(
                f"max_steps {self.max_steps} at log_every {self.log_every} logs {logged} train loss; the "
                f"smoke gate needs 2: set log_every to at most {self.max_steps // 2} or max_steps to at "
                f"least {2 * self.log_every}"
            )
        if not self.eval_at_start:
            raise ValueError(
                "eval_at_start false: the smoke gate judges validation from the untrained model's loss on; "
                "set eval_at_start to true"
            )
        return self


class FullTrainingConfig(TrainingConfig):
    """The full training stage's run, from random weights or, with `init_from`, from a model's
    (continued pretraining: the smoke run starts there too, and the corpus is encoded with that model's
    tokenizer instead of a trained one)."""

    require_cuda: bool = Field(default=False, description="stop before full training without CUDA")
    init_from: str | None = Field(
        default=None,
        description="a model URI training starts from (models:/NAME@ALIAS, hf:<hub id or folder>, a "
        "model-files folder); its tokenizer encodes the corpus. None: random initial weights",
    )

    def identity(self, exclude: frozenset[str] = frozenset()) -> JSONObject:
        """What decides the run's training, without where it starts (the start's identity is the weights'
        sha256, `gptcore.finetune.start.start_identity`, not the URI or the folder that named them)."""
        return super().identity(exclude | {"init_from"})


class FinetuneConfig(Strict):
    """Adapting a trained model to new text (flows.finetune): the parameter file's corpus is the new
    text, its `full` section the fine-tune's optimizer, schedule and budget. The architecture is the
    base's own (its files say it); a `model` section, if any, is checked against it."""

    name: str = Field(
        pattern=r"^[a-z0-9][a-z0-9-]{0,40}$",
        description="registered as gptpipe-iteration-N-<name>: lowercase letters, digits and dashes",
    )
    model: str = Field(
        description="the base: models:/NAME@ALIAS, models:/NAME/VERSION or a model-files folder "
        "(gptpipe finetune --model overrides it)"
    )
    method: FinetuneMethod = Field(
        default="lora",
        description="lora (adapters alone train), qlora (lora over the adapted layers' weights held in "
        "int8) or full",
    )
    compare: bool = Field(
        default=True,
        description="also train the other methods on the same data and steps, side by side: lora and "
        "full against each other, qlora against both",
    )
    lora: LoRAConfig = Field(
        default=LoRAConfig(), description="the adapters a LoRA (or QLoRA) fine-tune trains"
    )
    base_test_tokens: str | None = Field(
        default=None,
        description="the base corpus's test split (test.bin or its manifest), to measure what was "
        "forgotten; unset: the base's own (the test_split its registered version names) under "
        "paths.data_root, else the newest there made with the base's tokenizer",
    )
    format: Literal["text", "chat"] = Field(
        default="text",
        description="text: the corpus section's documents, every token a target; chat: the chat section's "
        "conversations, the loss on the assistant's answers alone (the base gains the chat template's "
        "tokens: gptcore.chat)",
    )

    @property
    def chat(self) -> bool:
        """Whether the fine-tune teaches the base to answer in the chat template."""
        return self.format == "chat"

    def methods(self) -> list[FinetuneMethod]:
        """The methods a run trains: `method`, then the others it is compared with when `compare`."""
        return [self.method, *_COMPARED[self.method]] if self.compare else [self.method]

    def adapters(self) -> LoRAConfig | None:
        """The adapters the training puts on the base (QLoRA's over its quantized layers; None: every
        weight trains); a chat fine-tune's train the embedding too, unless the file says otherwise (the
        chat template's new tokens have rows to learn)."""
        if self.method == "full":
            return None
        settings = self.lora.model_dump()
        if self.chat and "train_embedding" not in self.lora.model_fields_set:
            settings["train_embedding"] = True
        return QLoRAConfig(**settings) if self.method == "qlora" else LoRAConfig(**settings)


class TrackingConfig(Strict):
    """Where the pipeline's MLflow records go."""

    uri: str | None = Field(default=None, description="MLFLOW_TRACKING_URI wins; else the local store")
    artifact_root: str | None = Field(
        default=None, description="a new experiment's artifact location (None: beside a local store)"
    )
    experiment: str = Field(default="gptpipe", description="the MLflow experiment runs are recorded in")
    system_metrics: bool = Field(default=True, description="CPU, memory and GPU samples in each training run")
    registered_model: str | None = Field(
        default=None, description="the evaluate stage's registered model (None: gptpipe-iteration-N)"
    )


class ExportConfig(Strict):
    """Exports of the evaluated checkpoint after the evaluate stage."""

    hf: bool = Field(default=False, description="a Hugging Face GPT-2 folder (gptcore.export.hf)")


class QuantizeSection(QuantizeConfig):
    """The quantize stage: the evaluated checkpoint's trade-off table (empty `methods`: skipped), and
    whether a quantized model may become the champion."""

    may_hold_champion: bool = Field(
        default=False, description="a quantized model may take @champion with better test bits per byte"
    )

    @model_validator(mode="after")
    def _comparable_with_the_champion(self) -> QuantizeSection:
        if self.may_hold_champion and self.max_test_tokens is not None:
            raise ValueError(
                f"may_hold_champion needs max_test_tokens unset (it is {self.max_test_tokens}): the "
                "champion's test bits per byte cover the whole test split"
            )
        return self


class SweepConfig(Strict):
    """Trials of the pipeline that each override some keys (`tasks.params.sweep`): a grid over lists of
    values, or `random` combinations, where a value may also be a range `low..high` (log-uniform)."""

    grid: dict[str, list[Any] | str] = Field(
        default_factory=dict, description="key path (as --set takes it) -> its values, or low..high"
    )
    random: int | None = Field(default=None, ge=1, description="N random combinations instead of the grid")
    seed: int = Field(default=0, description="the random combinations' seed")
    parallel: int | None = Field(
        default=None, ge=1, description="trials at once on this machine (default: its number of devices)"
    )


class ScaleConfig(Strict):
    """`gptpipe scale`'s study (flows.scale): every depth of the size dial trained at every budget through
    the pipeline's stages, the law fitted to their test bits per byte, and the run a target budget buys
    written as a parameter file."""

    # The defaults are the grid measured on iteration 1's corpus on two CPU cores (docs/scaling.md): about
    # ten minutes, every point past the first plateau but depth 1's, whose embedding-bound curve the law
    # does not follow; its 4x target (4e13) lands within 3% of the law's prediction.
    depths: list[int] = Field(
        default=[2, 3, 4], min_length=1, description="the size dial's depths (model.depth) to train"
    )
    budgets: list[float] = Field(
        default=[2.5e12, 5e12, 1e13], min_length=1, description="training FLOPs budgets (full.max_flops)"
    )
    target_flops: float | None = Field(
        default=None, gt=0, description="the planned run's budget in FLOPs (default: 4x the largest budget)"
    )
    target_seconds: float | None = Field(
        default=None,
        gt=0,
        description="or in seconds of training on this device, priced by the grid's measured FLOP/s",
    )
    parameters: Literal["auto", "total", "non_embedding"] = Field(
        default="auto",
        description="the law's N: every parameter, the non-embedding ones, or auto: whichever predicts the "
        "largest budget from the smaller ones better",
    )
    bootstrap: int = Field(
        default=100, ge=0, le=10000, description="refits on resampled points behind the prediction's interval"
    )
    within_one_epoch: bool = Field(
        default=False,
        description="where the budget's best size would read the corpus more than once, plan the best size "
        "that reads it at most once (the law does not model repeated data) instead of refusing",
    )
    registered_model: str | None = Field(
        default=None, description="where the grid's models register (None: gptpipe-iteration-N-scaling)"
    )
    write: str | None = Field(
        default=None,
        description="the planned run's parameter file (None: iteration_N_planned.yaml beside the one read)",
    )

    @model_validator(mode="after")
    def _one_target(self) -> ScaleConfig:
        if self.target_flops is not None and self.target_seconds is not None:
            raise ValueError(
                f"target_flops {self.target_flops:g} and target_seconds {self.target_seconds:g}: give one"
            )
        if any(depth < 1 for depth in self.depths) or any(budget <= 0 for budget in self.budgets):
            raise ValueError(f"depths {self.depths} and budgets {self.budgets}: every one must be positive")
        return self


class PredictionConfig(Strict):
    """What a scaling study predicted for this run (`gptpipe scale` writes it into the parameter file it
    plans): the evaluate stage sets its measurement beside it."""

    test_bits_per_byte: float = Field(gt=0, description="the predicted test bits per byte")
    low: float = Field(gt=0, description="the interval's low end")
    high: float = Field(gt=0, description="the interval's high end")
    scale_run_id: str | None = Field(default=None, description="the MLflow run of the study behind it")


class PathsConfig(Strict):
    """Where the pipeline's files go, relative to the working folder unless absolute."""

    data_root: str = Field(default="data", description="tokenizers, token files and fine-tunes' bases")
    checkpoint_root: str = Field(default="checkpoints", description="runs' checkpoints and stage outputs")


class PipelineParams(Strict):
    """One iteration's parameter file, with its model profile resolved."""

    iteration: int = Field(ge=1, description="the iteration's number: names runs and registered models")
    model: ModelProfile | None = Field(
        default=None,
        description="the model profile (a name in the file, resolved on load); optional for a run from a "
        "start model (finetune.model, full.init_from), whose own files say its architecture: one given "
        "is checked against them",
    )
    corpus: CorpusConfig = Field(default=CorpusConfig(), description="where documents come from")
    tokenizer: TokenizerConfig = Field(default=TokenizerConfig(), description="the tokenizer stage")
    data: DataConfig = Field(default=DataConfig(), description="the tokens stage's build")
    runtime: RuntimeConfig = Field(default=RuntimeConfig(), description="device, precision, batch, processes")
    smoke: SmokeConfig = Field(default=SmokeConfig(), description="the smoke stage's bounded run")
    full: FullTrainingConfig = Field(default=FullTrainingConfig(), description="the full training stage")
    evaluate: EvaluateConfig = Field(default=EvaluateConfig(), description="the evaluate stage")
    export: ExportConfig = Field(default=ExportConfig(), description="the export stage")
    quantize: QuantizeSection = Field(default=QuantizeSection(), description="the quantize stage")
    sweep: SweepConfig = Field(default=SweepConfig(), description="`gptpipe sweep`'s trials")
    scale: ScaleConfig = Field(default=ScaleConfig(), description="`gptpipe scale`'s study")
    tracking: TrackingConfig = Field(default=TrackingConfig(), description="the MLflow store")
    paths: PathsConfig = Field(default=PathsConfig(), description="where files go")
    finetune: FinetuneConfig | None = Field(
        default=None, description="a fine-tune's parameter file (gptpipe finetune): the base and method"
    )
    chat: ChatDataConfig | None = Field(
        default=None,
        description="a chat fine-tune's conversations (finetune.format: chat; unset: the standard "
        "library's docstrings)",
    )
    prediction: PredictionConfig | None = Field(
        default=None, description="a scaling study's prediction of this run's test bits per byte"
    )

    @model_validator(mode="after")
    def _a_model_to_build(self) -> PipelineParams:
        """The model named, and its vocabulary able to hold the tokenizer trained for it; a run from a start
        model takes that model's architecture and tokenizer (`tasks.stages.start_model`)."""
        if self.start_model_key() is not None:
            return self
        if self.model is None:
            raise ValueError(
                "model: missing required key: name a profile of params/profiles/ (only a run from "
                "finetune.model or full.init_from takes its model's own architecture)"
            )
        if self.tokenizer.vocab_size > self.model.architecture.vocab_size:
            raise ValueError(
                f"tokenizer.vocab_size {self.tokenizer.vocab_size} exceeds the model's vocabulary "
                f"{self.model.architecture.vocab_size}"
            )
        return self

    @model_validator(mode="after")
    def _finetune_keeps_the_base_tokenizer(self) -> PipelineParams:
        if self.finetune is not None and self.full.init_from is not None:
            raise ValueError("full.init_from: a fine-tune starts from finetune.model; remove full.init_from")
        if self.finetune is not None and "tokenizer" in self.model_fields_set:
            raise ValueError(
                "tokenizer: a fine-tune encodes its corpus with the base model's tokenizer, never a new "
                "vocabulary: remove the tokenizer section"
            )
        if self.chat is not None and (self.finetune is None or not self.finetune.chat):
            raise ValueError("chat: read by a chat fine-tune alone: set finetune.format: chat, or remove it")
        if self.full.init_from is not None and self.tokenizer.model_fields_set - {"end_of_text"}:
            raise ValueError(
                "tokenizer: full.init_from's model encodes the corpus with its own tokenizer, none is "
                "trained: remove the tokenizer section (end_of_text alone may name its end-of-text token)"
            )
        return self

    def chat_data(self) -> ChatDataConfig:
        """A chat fine-tune's conversations: the chat section, else the standard library's docstrings."""
        return self.chat or ChatDataConfig()

    def start_model_key(self) -> str | None:
        """The key naming the model training starts from: finetune.model, full.init_from, or None."""
        if self.finetune is not None:
            return "finetune.model"
        return "full.init_from" if self.full.init_from is not None else None

    def model_profile(self) -> ModelProfile:
        """The model the file names: what training builds from random weights (a start model's own,
        resolved by the stage before training, travels as `tasks.params.jobs.TrainingStart`)."""
        if self.model is None:
            raise ConfigError(
                f"model: none named, and {self.start_model_key()}'s architecture is read from its files "
                "only by gptpipe run and gptpipe finetune: name a profile in model to train it here"
            )
        return self.model

    def training_section(self, stage: TrainingStage) -> TrainingConfig:
        """The settings a stage trains with: the smoke section takes the full section's optimizer unless
        it names its own (`smoke_optimizer_source`); a model on the size dial scales the AdamW rates by
        its width (`ModelProfile.learning_rate_scale`)."""
        if stage == "full":
            section: TrainingConfig = self.full
        else:
            section = self.smoke.model_copy(update={"optimizer": self.smoke.optimizer or self.full.optimizer})
        scale = self.model.learning_rate_scale() if self.model is not None else 1.0
        if scale == 1.0:
            return section
        return section.model_copy(update={"optimizer": section.optimizer.scaled(scale)})

    def model_params(self) -> dict[str, Any]:
        """The model profile as `model.*` run params (none while a start model's is not resolved)."""
        return self.model.as_params() if self.model is not None else {}

    def optimizer_params(self, stage: TrainingStage = "full") -> dict[str, Any]:
        """The stage's optimizer settings as `optimizer.*` run params: its name always, Muon's settings
        only when it is chosen."""
        optimizer = self.training_section(stage).optimizer
        settings = {"name": optimizer.name} | optimizer.identity()
        return {f"optimizer.{key}": value for key, value in settings.items()}

    @property
    def smoke_optimizer_source(self) -> Literal["smoke", "full"]:
        """Whose optimizer settings the smoke run trains with."""
        return "smoke" if self.smoke.optimizer is not None else "full"

    def full_refusal(self, device: str) -> str | None:
        """Why full training must not start on a machine whose runtime device is `device`, or None: the
        pipeline's full stage asks after the smoke, `gptpipe run` before the first stage."""
        if not self.full.require_cuda or device == "cuda":
            return None
        if self.runtime.device == "cpu" and self.full.max_steps is not None:
            return None  # the parameters explicitly ask for a bounded CPU run
        return (
            f"full training stopped: iteration {self.iteration} needs CUDA (full.require_cuda: true) and "
            "this machine has none; the smoke record is complete. Run on a CUDA machine, or set "
            "runtime.device=cpu with a bounded full.max_steps to train on CPU anyway."
        )

    def defaults_for(self, device: ConcreteDevice, model: ModelProfile | None = None) -> DeviceDefaults:
        """The runtime defaults for a resolved device: the parameter file's, else the profile's of the
        model trained (`model`: a start model's; None: the file's), an accelerator (CUDA, Apple's MPS)
        taking the `gpu` ones."""
        profile = model or self.model_profile()
        if device != "cpu":
            return self.runtime.gpu or profile.gpu
        return self.runtime.cpu or profile.cpu
