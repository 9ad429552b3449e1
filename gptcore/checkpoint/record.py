"""A checkpoint's record (its `.json` sidecar) and the folder's manifest, as typed records.

The keys on disk are the fields' names, as gptpipe has always written them; a record of an older
gptpipe (fewer keys: tests/fixtures/run_before_issue_27) reads with the missing fields None, and keys
this gptpipe does not know are passed over. An adapted (LoRA) checkpoint is one whose `config` holds
`lora.*` settings, as every gptpipe wrote it: `CheckpointRecord.adapters` reads them back as typed
settings, `adapted` says whether there are any.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from gptcore.errors import CheckpointError
from gptcore.finetune.config import LoRAConfig, adapter_settings
from gptcore.finetune.start import lora_of
from gptcore.model.config import ModelConfig
from gptcore.tools.records import JSONObject, Settings, known_fields

FORMAT_VERSION = 1
_LOSSES = ("train_loss", "val_loss")


@dataclass(frozen=True)
class MergedFrom:
    """What a merged checkpoint was merged from (`gptcore.checkpoint.merge`)."""

    checkpoint: str  # the adapted checkpoint's path
    sha256: str  # its content's
    adapters: LoRAConfig  # the adapters folded in: on disk their settings' keys, beside the two above

    def to_dict(self) -> JSONObject:
        return {"checkpoint": self.checkpoint, "sha256": self.sha256, **self.adapters.model_dump()}

    @classmethod
    def from_dict(cls, data: JSONObject) -> MergedFrom:
        settings = {key: value for key, value in data.items() if key not in ("checkpoint", "sha256")}
        return cls(data["checkpoint"], data["sha256"], adapter_settings(settings))


@dataclass(frozen=True)
class CheckpointRecord:
    """One checkpoint's record: what the run wrote it as, and (once published) the file it describes."""

    kind: str  # step (periodic), best or final
    step: int | None = None  # the optimizer steps taken; None only in a foreign record (refused to resume)
    epoch: int | None = None  # the epoch the step falls in
    fingerprint: str | None = None  # the run's fingerprint (gptcore.train.setup)
    config: Settings | None = None  # what a resume must match (gptcore.train.setup.trajectory_settings)
    model_config: ModelConfig | None = None  # the model's architecture
    metadata: dict[str, str] = field(default_factory=dict)  # the MLflow run id when tracked; the tokenizer
    train_loss: float | None = None  # the last logged train loss when written
    val_loss: float | None = None  # the last validation loss when written
    code_version: str | None = None  # the code that wrote it (gptcore.tools.fingerprint.code_version)
    merged_from: MergedFrom | None = None  # a merged checkpoint's source
    # What publishing the file adds (gptcore.checkpoint.files._publish):
    name: str | None = None  # the checkpoint's name: its file's stem
    file: str | None = None  # the `.pt` file's name, beside the record
    sha256: str | None = None  # the `.pt` file's content
    bytes: int | None = None  # the `.pt` file's size
    format_version: int | None = None  # the checkpoint format (FORMAT_VERSION)
    written_at: float | None = None  # Unix time

    @property
    def adapters(self) -> LoRAConfig | None:
        """The LoRA (or QLoRA) settings an adapted checkpoint trained with; None: a plain model's."""
        return lora_of(self.config or {})

    @property
    def adapted(self) -> bool:
        """Whether the checkpoint holds a LoRA run's adapted model, its adapters not merged."""
        return self.adapters is not None

    def architecture(self, path: object) -> ModelConfig:
        """The model's config; a CheckpointError naming `path` when the record has none."""
        if self.model_config is None:
            raise CheckpointError(f"{path}: its record names no model_config")
        return self.model_config

    def unpublished(self) -> CheckpointRecord:
        """The record without what publishing a file added: what a checkpoint derived from it starts with."""
        return replace(
            self, name=None, file=None, sha256=None, bytes=None, format_version=None, written_at=None
        )

    def to_dict(self) -> JSONObject:
        """As the sidecar holds it: the losses always (null before the first), every other field that is
        set (a record written without one has no key)."""
        data = {key: value for key, value in asdict(self).items() if value is not None or key in _LOSSES}
        if self.model_config is not None:
            data["model_config"] = self.model_config.model_dump()
        if self.merged_from is not None:
            data["merged_from"] = self.merged_from.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: object) -> CheckpointRecord:
        """A sidecar's record; a CheckpointError naming `where` when it is not one."""
        values = known_fields(cls, data)
        try:
            if values.get("model_config") is not None:
                values["model_config"] = ModelConfig.model_validate(values["model_config"])
            if values.get("merged_from") is not None:
                values["merged_from"] = MergedFrom.from_dict(values["merged_from"])
            return cls(**values)
        except (TypeError, KeyError, ValidationError) as error:
            raise CheckpointError(f"{where}: unreadable checkpoint record ({type(error).__name__})") from None


@dataclass(frozen=True)
class ManifestEntry:
    """One checkpoint the folder's manifest lists."""

    file: str  # `<name>.pt`
    sha256: str  # the file's content when written
    step: int  # the optimizer steps it holds
    kind: str  # step, best or final

    @classmethod
    def of(cls, record: CheckpointRecord) -> ManifestEntry:
        """The entry of a published record."""
        if record.file is None or record.sha256 is None or record.step is None:
            raise CheckpointError(f"{record.name}: a record not yet published has no manifest entry")
        return cls(record.file, record.sha256, record.step, record.kind)


@dataclass
class CheckpointManifest:
    """The folder's `manifest.json` (written as `asdict` gives it): its checkpoints by name."""

    checkpoints: dict[str, ManifestEntry] = field(default_factory=dict)  # name -> entry
    format_version: int = FORMAT_VERSION  # the checkpoint format
