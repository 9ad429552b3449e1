"""Token files as MLflow dataset inputs, so a run's *Dataset* column names what it read.

Light by design: only each token file's manifest is read (name, sha256 as digest, token and document
counts, text bytes, the tokenizer's hash), never its tokens. A bare stream without a manifest, or a
synthetic one, has nothing to declare and is left out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlflow.entities import DatasetInput

# The `mlflow.data.context` a split is read in.
CONTEXTS = {"train": "training", "validation": "validation", "test": "test"}


def token_file_inputs(files: Mapping[str, str | Path | None]) -> list[DatasetInput]:
    """`DatasetInput`s for {split: token file path}; entries that are not files with a manifest are
    skipped."""
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    from gptcore.data.tokenfile import read_manifest

    inputs = []
    for split, path in files.items():
        if not isinstance(path, str | Path) or not Path(path).is_file():
            continue
        manifest = read_manifest(path)
        if manifest is None:
            continue
        profile = {
            "tokens": manifest.token_count,
            "documents": manifest.document_count,
            "text_bytes": manifest.text_bytes,
            "tokenizer_sha256": manifest.tokenizer_sha256,
            "corpus_fingerprint": manifest.corpus_fingerprint,
        }
        schema = {
            "dtype": manifest.dtype,
            "vocab_size": manifest.vocab_size,
            "end_of_text_id": manifest.end_of_text_id,
        }
        dataset = Dataset(
            name=f"tokens-{manifest.split}",
            digest=manifest.sha256[:16],
            source_type="local",
            source=json.dumps({"uri": Path(path).resolve().as_uri()}),
            schema=json.dumps(schema),
            profile=json.dumps(profile),
        )
        context = CONTEXTS.get(split, split)
        inputs.append(DatasetInput(dataset, [InputTag(MLFLOW_DATASET_CONTEXT, context)]))
    return inputs
