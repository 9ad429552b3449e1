"""Typed parameters: model profiles and iteration files, validated before any stage starts.

A parameter file names a model profile (`params/profiles/<name>.yaml`) and holds every other setting of
the pipeline. Errors come out as one line naming the file, the key path, the value and what is allowed.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gptcore.errors import ConfigError

PARAMS_DIR = Path(__file__).resolve().parent.parent / "params"
PROFILES_DIR = PARAMS_DIR / "profiles"

Device = Literal["auto", "cpu", "cuda", "mps"]
ConcreteDevice = Literal["cpu", "cuda", "mps"]
Precision = Literal["auto", "fp32", "bf16", "fp16"]
ConcretePrecision = Literal["fp32", "bf16", "fp16"]
PositiveInt = Annotated[int, Field(ge=1)]
TrainingStage = Literal["smoke", "full"]
STAGES = ("tokenizer", "tokens", "device", "smoke", "full", "evaluate", "export", "quantize")
# A fine-tune's stages (flows.finetune): the base model in place of a tokenizer, its training `finetune`,
# and the before/after measurement on the new corpus's test split and the base corpus's.
FINETUNE_STAGES = ("base", "tokens", "device", "smoke", "finetune", "evaluate", "before-after")
FinetuneMethod = Literal["lora", "full"]


class Strict(BaseModel):
    """Unknown keys are errors, values are not coerced across types, models are immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# --- model profiles -------------------------------------------------------------------------------


class ModelConfig(Strict):
    """GPT-2 layout: learned positions, pre-norm LayerNorm, tied embeddings."""

    n_layer: int = Field(ge=1, le=256)
    n_head: int = Field(ge=1, le=256)
    n_embd: int = Field(ge=1, le=65536)
    block_size: int = Field(ge=2, le=1 << 20, description="context length in tokens")
    vocab_size: int = Field(ge=257, le=1 << 32)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    bias: bool = True

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelConfig:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} must be a multiple of n_head {self.n_head}")
        return self


class DeviceDefaults(Strict):
    """What a profile runs with on one kind of device unless the user says otherwise."""

    batch_size: int = Field(ge=1, le=1 << 16)
    grad_accum_steps: int = Field(default=1, ge=1, le=1 << 16)
    precision: ConcretePrecision = "fp32"
    workers: int = Field(default=0, ge=0, le=64)


class ModelProfile(Strict):
    name: str
    architecture: ModelConfig
    cpu: DeviceDefaults
    gpu: DeviceDefaults


# --- pipeline sections ----------------------------------------------------------------------------


class CorpusConfig(Strict):
    """Where documents come from, and how they split into train, validation and test."""

    source: Literal["builtin:python-stdlib", "local", "hub"] = "builtin:python-stdlib"
    paths: list[str] = Field(default_factory=list, description="files, folders or globs (local)")
    format: Literal["auto", "text", "jsonl", "parquet"] = "auto"
    text_field: str = "text"
    document_per: Literal["file", "line"] = "file"
    hub_name: str | None = None
    hub_config: str | None = None
    hub_split: str = "train"
    hub_revision: str | None = Field(
        default=None, description="a hub dataset's commit or tag: pins what a streamed source holds"
    )
    streaming: bool = Field(
        default=False,
        description="hub: read documents as they arrive (datasets' streaming mode), no full local copy; "
        "local files are always read a piece at a time",
    )
    validation_fraction: float = Field(default=0.05, gt=0.0, lt=1.0)
    test_fraction: float = Field(
        default=0.05, gt=0.0, lt=1.0, description="held out for the evaluate stage alone"
    )
    split_seed: int = 1337
    max_documents: int | None = Field(default=None, ge=1, description="the first N non-empty documents")
    max_bytes: int | None = Field(
        default=None, ge=1, description="documents in source order until their UTF-8 text reaches N bytes"
    )

    @model_validator(mode="after")
    def _source_has_its_settings(self) -> CorpusConfig:
        if self.source == "local" and not self.paths:
            raise ValueError("source 'local' needs corpus.paths: a list of files, folders or globs")
        if self.source == "hub" and not self.hub_name:
            raise ValueError("source 'hub' needs corpus.hub_name: a dataset name on the hub")
        if self.validation_fraction + self.test_fraction >= 1.0:
            raise ValueError(
                f"corpus.validation_fraction {self.validation_fraction} + corpus.test_fraction "
                f"{self.test_fraction} leave nothing to train on; their sum must be below 1"
            )
        return self


class TokenizerConfig(Strict):
    vocab_size: int = Field(default=8192, ge=257, le=1 << 32)
    min_frequency: int = Field(default=2, ge=1)
    end_of_text: str = "<|endoftext|>"
    sample_bytes: int = Field(
        default=512 * 1024 * 1024,
        ge=1,
        description="BPE learns from a seeded sample of the train split of about this much text (the whole "
        "split when smaller), so its cost stops growing with the corpus",
    )
    sample_seed: int = Field(default=0, description="which parts of the corpus the sample reads")


class DataConfig(Strict):
    """How the token files are built: shard size, worker processes, and a token budget."""

    shard_tokens: int = Field(
        default=100_000_000, ge=256, description="tokens per shard file (the last of a split holds the rest)"
    )
    workers: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="encoding processes (None: one per core); never in the output",
    )
    max_tokens: int | None = Field(
        default=None,
        ge=1,
        description="stop reading the corpus once the train split holds this many tokens (whole documents)",
    )


class RuntimeConfig(Strict):
    """What the user asks for; `gptcore.runtime.device` resolves `auto` and the unset fields per device."""

    device: Device = "auto"
    precision: Precision = "auto"
    batch_size: PositiveInt | Literal["auto"] | None = Field(
        default=None,
        description="per rank and micro-step; auto: the largest that fits (gptcore.runtime.batch_size)",
    )
    grad_accum_steps: int | None = Field(default=None, ge=1)
    effective_batch_size: int | None = Field(
        default=None, ge=1, description="samples per optimizer step; sets the accumulation for the batch"
    )
    workers: int | None = Field(default=None, ge=0)
    nproc: int | Literal["auto"] = 1
    compile: bool | Literal["auto"] = Field(
        default="auto",
        description="torch.compile the model (needs a C compiler); auto: on for CUDA (a failed start-up "
        "probe trains eager and says why), off on the CPU, where it did not pay",
    )
    activation_checkpointing: bool = Field(
        default=False,
        description="recompute each transformer block in the backward pass: less memory, more compute",
    )
    cpu: DeviceDefaults | None = None
    gpu: DeviceDefaults | None = None

    @field_validator("compile", mode="before")
    @classmethod
    def _compile_choice(cls, value: Any) -> Any:
        if value is True or value is False or value == "auto":
            return value
        raise ValueError("expected true, false or auto")

    @model_validator(mode="after")
    def _effective_batch_divides(self) -> RuntimeConfig:
        batch, effective = self.batch_size, self.effective_batch_size
        if isinstance(batch, int) and effective is not None and effective % batch:
            raise ValueError(
                f"runtime.effective_batch_size {effective} is not a multiple of runtime.batch_size {batch}"
            )
        return self


class OptimizerConfig(Strict):
    learning_rate: float = Field(default=1e-3, gt=0.0, le=10.0)
    min_learning_rate: float = Field(default=1e-4, ge=0.0, le=10.0)
    warmup_steps: int = Field(default=20, ge=0)
    weight_decay: float = Field(default=0.1, ge=0.0)
    beta1: float = Field(default=0.9, ge=0.0, lt=1.0)
    beta2: float = Field(default=0.95, ge=0.0, lt=1.0)
    grad_clip: float = Field(default=1.0, ge=0.0, description="0 turns clipping off")


class TrainingConfig(Strict):
    """One training run's budget and cadence."""

    epochs: int = Field(default=1, ge=1)
    max_steps: int | None = Field(default=None, ge=1, description="optimizer steps; caps epochs")
    max_tokens: int | None = Field(
        default=None,
        ge=1,
        description="tokens to train on (every step's inputs), rounded up to whole steps; caps epochs",
    )
    training_examples: int | None = Field(default=None, ge=1)
    validation_examples: int | None = Field(default=None, ge=1)
    log_every: int = Field(default=10, ge=1)
    eval_every: int = Field(default=100, ge=1)
    checkpoint_every: int = Field(default=100, ge=1)
    keep_last: int = Field(default=2, ge=1)
    async_checkpoints: bool = Field(
        default=True, description="write checkpoints on a background thread: the loop waits for a copy only"
    )
    max_skipped_steps: int = Field(default=25, ge=1, description="fp16: consecutive overflow skips that stop")
    eval_at_start: bool = Field(
        default=False, description="evaluate before the first step: the baseline later ones are judged by"
    )
    seed: int = 1337
    optimizer: OptimizerConfig = OptimizerConfig()

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


class SmokeConfig(TrainingConfig):
    """A bounded run that proves the full run's configuration trains and fits, and measures throughput:
    the full run's first steps, with its optimizer and its learning-rate schedule (warmup included)."""

    max_steps: int | None = Field(default=20, ge=2)
    log_every: int = Field(default=5, ge=1)
    eval_every: int = Field(default=20, ge=1)
    checkpoint_every: int = Field(default=1000, ge=1)
    eval_at_start: bool = True
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
    require_cuda: bool = Field(default=False, description="stop before full training without CUDA")


# The linear layers LoRA may adapt, in the model's own terms (gptcore.model.gpt: each block's `attn` and
# `mlp`); the tied embedding and output head are never adapted.
LoRATarget = Literal["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]


class LoRAConfig(Strict):
    """Low-rank adapters on a model's linear layers (gptcore.finetune.lora): each adapted weight W
    trains as W + B·A·alpha/r, W frozen, A (r x in) random, B (out x r) zero at the start."""

    r: int = Field(default=8, ge=1, description="the rank: at most the smaller side of each adapted layer")
    alpha: float = Field(default=16.0, gt=0.0, description="the update's scale is alpha / r")
    dropout: float = Field(default=0.05, ge=0.0, lt=1.0, description="on the adapter's input, in training")
    targets: list[LoRATarget] = Field(
        default=["attn.c_attn", "attn.c_proj"], min_length=1, description="the layers adapted in every block"
    )


class FinetuneConfig(Strict):
    """Adapting a trained model to new text (flows.finetune): the parameter file's corpus is the new
    text, its `full` section the fine-tune's optimizer, schedule and budget, its `model` the base's
    architecture (checked against the base's before anything trains)."""

    name: str = Field(
        pattern=r"^[a-z0-9][a-z0-9-]{0,40}$",
        description="registered as gptpipe-iteration-N-<name>: lowercase letters, digits and dashes",
    )
    model: str = Field(
        description="the base: models:/NAME@ALIAS, models:/NAME/VERSION or a model-files folder "
        "(gptpipe finetune --model overrides it)"
    )
    method: FinetuneMethod = Field(default="lora", description="lora (adapters alone train) or full")
    compare: bool = Field(
        default=True, description="also train the other method on the same data and steps, side by side"
    )
    lora: LoRAConfig = LoRAConfig()
    base_test_tokens: str | None = Field(
        default=None,
        description="the base corpus's test split (test.bin or its manifest), to measure what was "
        "forgotten; unset: the newest one under paths.data_root made with the base's tokenizer",
    )
    weights: str | None = Field(
        default=None, description="set by the base stage: the base's model files, resolved from `model`"
    )

    def methods(self) -> list[FinetuneMethod]:
        """The methods a run trains: `method`, then the other one when `compare`."""
        other: FinetuneMethod = "full" if self.method == "lora" else "lora"
        return [self.method, other] if self.compare else [self.method]

    def adapters(self) -> LoRAConfig | None:
        """The adapters the training puts on the base (None: every weight trains)."""
        return self.lora if self.method == "lora" else None


class TrackingConfig(Strict):
    uri: str | None = Field(default=None, description="MLFLOW_TRACKING_URI wins; else the local store")
    artifact_root: str = "mlruns/artifacts"
    experiment: str = "gptpipe"
    system_metrics: bool = True
    registered_model: str | None = Field(
        default=None, description="the evaluate stage's registered model (None: gptpipe-iteration-N)"
    )


class EvaluateConfig(Strict):
    """The held-out evaluation after full training: which checkpoint, and the samples it draws."""

    checkpoint: Literal["best", "final"] = Field(
        default="best", description="the checkpoint evaluated (best: lowest validation loss)"
    )
    prompts: int = Field(default=4, ge=0, le=64, description="prompts from the test split's document starts")
    prompt_tokens: int = Field(default=16, ge=1, le=1024, description="tokens of each prompt")
    max_new_tokens: int = Field(default=48, ge=1, le=4096)
    temperature: float = Field(default=0.8, gt=0.0, le=10.0, description="of the sampled continuation")
    top_k: int | None = Field(default=50, ge=1)
    seed: int = 0
    batch_size: int = Field(default=8, ge=1, description="test windows per forward pass")
    max_tokens: int | None = Field(
        default=None, ge=1, description="evaluate the test stream's first N tokens only (None: all)"
    )


class ExportConfig(Strict):
    """Exports of the evaluated checkpoint after the evaluate stage."""

    hf: bool = Field(default=False, description="a Hugging Face GPT-2 folder (gptcore.export.hf)")


QuantizationMethod = Literal[
    "fp32", "bf16", "int8-weight-only", "int8-dynamic", "int4-weight-only"
]  # gptcore.model.quantization


class QuantizeConfig(Strict):
    """Post-training quantization of the evaluated checkpoint (the quantize stage), one row of a
    trade-off table per method; fp32, the reference, is always measured."""

    methods: list[QuantizationMethod] = Field(
        default_factory=list, description="the methods to measure; empty: the stage is skipped"
    )
    max_test_tokens: int | None = Field(
        default=None, ge=1, description="measure the test stream's first N tokens only (None: all)"
    )
    new_tokens: int = Field(default=128, ge=1, le=1024, description="greedy tokens per timed generation")
    repeats: int = Field(default=5, ge=1, le=50, description="timed generations; the median is kept")
    may_hold_champion: bool = Field(
        default=False, description="a quantized model may take @champion with better test bits per byte"
    )

    @model_validator(mode="after")
    def _comparable_with_the_champion(self) -> QuantizeConfig:
        if self.may_hold_champion and self.max_test_tokens is not None:
            raise ValueError(
                f"may_hold_champion needs max_test_tokens unset (it is {self.max_test_tokens}): the "
                "champion's test bits per byte cover the whole test split"
            )
        return self


class SweepConfig(Strict):
    """Trials of the pipeline that each override some keys (`gptcore.sweep`): a grid over lists of
    values, or `random` combinations, where a value may also be a range `low..high` (log-uniform)."""

    grid: dict[str, list[Any] | str] = Field(
        default_factory=dict, description="key path (as --set takes it) -> its values, or low..high"
    )
    random: int | None = Field(default=None, ge=1, description="N random combinations instead of the grid")
    seed: int = Field(default=0, description="the random combinations' seed")
    parallel: int | None = Field(
        default=None, ge=1, description="trials at once on this machine (default: its number of devices)"
    )


class PathsConfig(Strict):
    data_root: str = "data"
    checkpoint_root: str = "checkpoints"


class PipelineParams(Strict):
    """One iteration's parameter file, with its model profile resolved."""

    iteration: int = Field(ge=1)
    model: ModelProfile
    corpus: CorpusConfig = CorpusConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    data: DataConfig = DataConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    smoke: SmokeConfig = SmokeConfig()
    full: FullTrainingConfig = FullTrainingConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    export: ExportConfig = ExportConfig()
    quantize: QuantizeConfig = QuantizeConfig()
    sweep: SweepConfig = SweepConfig()
    tracking: TrackingConfig = TrackingConfig()
    paths: PathsConfig = PathsConfig()
    finetune: FinetuneConfig | None = None  # a fine-tune's parameter file (gptpipe finetune)

    @model_validator(mode="after")
    def _tokenizer_fits_model(self) -> PipelineParams:
        if self.finetune is None and self.tokenizer.vocab_size > self.model.architecture.vocab_size:
            raise ValueError(
                f"tokenizer.vocab_size {self.tokenizer.vocab_size} exceeds the model's vocabulary "
                f"{self.model.architecture.vocab_size}"
            )
        return self

    @model_validator(mode="after")
    def _finetune_keeps_the_base_tokenizer(self) -> PipelineParams:
        if self.finetune is not None and "tokenizer" in self.model_fields_set:
            raise ValueError(
                "tokenizer: a fine-tune encodes its corpus with the base model's tokenizer, never a new "
                "vocabulary: remove the tokenizer section"
            )
        return self

    def training_section(self, stage: TrainingStage) -> TrainingConfig:
        """The settings a stage trains with: the smoke section takes the full section's optimizer unless
        it names its own (`smoke_optimizer_source`)."""
        if stage == "full":
            return self.full
        return self.smoke.model_copy(update={"optimizer": self.smoke.optimizer or self.full.optimizer})

    @property
    def smoke_optimizer_source(self) -> Literal["smoke", "full"]:
        """Whose optimizer settings the smoke run trains with."""
        return "smoke" if self.smoke.optimizer is not None else "full"

    def defaults_for(self, device: ConcreteDevice) -> DeviceDefaults:
        """The runtime defaults for a resolved device: the parameter file's, else the profile's (an
        accelerator, CUDA or Apple's MPS, takes the `gpu` ones)."""
        if device != "cpu":
            return self.runtime.gpu or self.model.gpu
        return self.runtime.cpu or self.model.cpu


# --- loading --------------------------------------------------------------------------------------


class ParamsLoader(yaml.SafeLoader):
    """Safe YAML that reads `1e-3` as a float, as YAML 1.2 does (PyYAML's 1.1 rules make it a string)."""


ParamsLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d[\d_]*)?(?:\.\d*)?[eE][-+]?\d+$"),
    list("-+0123456789."),
)


def _describe_error(source: str, error: ValidationError) -> str:
    """The first validation error as one line: file, key path, value, what is allowed."""
    first = error.errors()[0]
    key = ".".join(str(part) for part in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    if not key:  # a check across sections: its message names the keys
        return f"{source}: {message}"
    if first["type"] == "extra_forbidden":
        return f"{source}: {key}: unknown key"
    if first["type"] == "missing":
        return f"{source}: {key}: missing required key"
    if isinstance(first.get("input"), dict):  # a whole section: its message names the keys, not a dump
        return f"{source}: {key}: {message}"
    return f"{source}: {key}: value {first.get('input')!r} is not allowed: {message}"


def read_yaml(path: Path, what: str = "parameter file") -> dict[str, Any]:
    """A YAML mapping, loaded safely; every failure is a ConfigError naming the file. Any readable path
    will do (a pipe from the shell too); a missing one is refused as not found."""
    if not path.exists():
        raise ConfigError(f"{path}: {what} not found")
    if path.is_dir():
        raise ConfigError(f"{path}: the {what} is a folder; name a YAML file")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=ParamsLoader)
    except OSError as error:
        raise ConfigError(f"{path}: the {what} cannot be read ({error.strerror or error})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (it is not valid UTF-8)") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or "malformed YAML"
        raise ConfigError(f"{path}: invalid YAML{where}: {problem}") from None
    if data is None:
        raise ConfigError(f"{path}: the {what} is empty")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the {what} must be a mapping of keys, found {type(data).__name__}")
    return data


def load_profile(name_or_path: str, base: Path = PROFILES_DIR) -> ModelProfile:
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = base / f"{name_or_path}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in base.glob("*.yaml")))
        raise ConfigError(f"model profile {name_or_path!r} not found (known profiles: {known})")
    data = read_yaml(path, "model profile")
    try:
        return ModelProfile.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_describe_error(str(path), error)) from None


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """`key.path=value`, the value read as YAML (so `3`, `1e-3`, `true`, `[a, b]` keep their types)."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {assignment!r}: expected key.path=value")
    try:
        value = yaml.load(raw, Loader=ParamsLoader) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    node = data
    parts = key.strip().split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {assignment!r}: {part} is a value, not a section")
        node = child
    node[parts[-1]] = value


def load_params(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> PipelineParams:
    """Read, override and validate a parameter file; the model profile resolves beside `params/profiles`."""
    path = Path(path)
    data = read_yaml(path)
    profiles = path.resolve().parent / "profiles"
    profiles = profiles if profiles.is_dir() else PROFILES_DIR
    for assignment in overrides:
        if assignment.startswith("model.") and isinstance(data.get("model"), str):  # a key of the profile
            data["model"] = load_profile(data["model"], profiles).model_dump()
        apply_override(data, assignment)
    source = f"{path}" + (" (with --set)" if overrides else "")
    profile_ref = data.get("model")
    if isinstance(profile_ref, str):
        data["model"] = load_profile(profile_ref, profiles)
    try:
        return PipelineParams.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_describe_error(source, error)) from None


def iteration_file(iteration: int) -> Path:
    path = PARAMS_DIR / f"iteration_{iteration}.yaml"
    if not path.is_file():
        files = PARAMS_DIR.glob("iteration_*.yaml")
        known = ", ".join(sorted(p.stem.removeprefix("iteration_") for p in files))
        raise ConfigError(
            f"--iteration {iteration}: no parameter file {path.name} (known iterations: {known})"
        )
    return path


def choice(flag: str, value: str, allowed: Any) -> str:
    """`value` when it is one of `allowed` (a tuple, or a `Literal` type of the config), else a one-line
    error naming the flag, the value and what is allowed."""
    options = typing.get_args(allowed) or tuple(allowed)
    if value not in options:
        raise ConfigError(f"{flag} {value!r}: expected one of {', '.join(options)}")
    return value
