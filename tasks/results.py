"""What every stage's result is (`StageResult`), and what the stages after training read
(`CheckpointsResult`). Each stage's own result type lives beside it in its module of `tasks/stages/`.

Every result names its output files with their sha256 (`files`: a cache hit is trusted only while they
are unchanged), the paths a person looks at (`outputs`) and the headline figures the report and MLflow
show (`figures`). Results are small: never tensors or datasets. gptcore's records inside a result are
typed (`Record[...]`): read from the JSON the record holds, written back as the record writes itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, PlainSerializer, PlainValidator, TypeAdapter

from gptcore.tools.fingerprint import sha256_file

# A figure as MLflow and the report take it: a number, a word, a flag, or none measured.
Figure = float | int | str | bool | None
T = TypeVar("T")


class StageResult(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    fingerprint: str | None = None  # what determined the outputs (None: a stage that is never cached)
    files: dict[str, str] = {}  # output path -> sha256
    outputs: list[str] = []
    figures: dict[str, Figure] = {}

    def stale_outputs(self) -> list[str]:
        """Output files that are missing or whose content changed since the stage wrote them."""
        return [path for path, digest in self.files.items() if not _unchanged(path, digest)]


class CheckpointsResult(StageResult):
    """A stage whose outputs are checkpoints of plain models, in `run_directory`: the stages after
    training read them (`tasks.stages.reading.ReadCheckpoint`)."""

    run_directory: str


def _unchanged(path: str, digest: str) -> bool:
    return Path(path).is_file() and sha256_file(path) == digest


def file_record(*paths: str | Path) -> dict[str, str]:
    """The `files` of a result: each output path with its content hash."""
    return {str(path): sha256_file(path) for path in paths}


class _RecordOf:
    """`Record[cls]`: a gptcore record (a dataclass) as a result's field, validated from its JSON by the
    class's own `from_dict` where it has one (which reads its older forms), else field by field, and
    written as its `to_dict()` (what it writes into its own files)."""

    def __getitem__(self, cls: type[T]) -> Any:
        read = getattr(cls, "from_dict", None) or TypeAdapter(cls).validate_python

        def validate(value: Any) -> Any:
            return value if isinstance(value, cls) else read(value)

        return Annotated[cls, PlainValidator(validate), PlainSerializer(lambda value: value.to_dict())]


Record = _RecordOf()
