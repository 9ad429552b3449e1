"""The corpus as the data stages read it: opened once per process, because hashing its files is the
costly part, and the fingerprint the stages are keyed on must be the one of the files they then read."""

from __future__ import annotations

from pathlib import Path

from gptcore.data.config import CorpusConfig
from gptcore.data.corpus import Corpus, open_corpus
from tasks.params.schema import PipelineParams

_opened: dict[str, Corpus] = {}


def corpus_for(cfg: CorpusConfig, data_root: Path, fresh: bool = False) -> Corpus:
    """The corpus as this run opened it; `fresh` opens it again (a run's start: files may have changed
    since an earlier run of a long-lived process)."""
    key = cfg.model_dump_json() + str(Path(data_root).resolve())
    if fresh or key not in _opened:
        _opened.clear()
        _opened[key] = open_corpus(cfg, Path(data_root) / "datasets-cache")
    return _opened[key]


def data_root(params: PipelineParams) -> Path:
    """`paths.data_root`, absolute: tokenizers, token files and start models live under it."""
    return Path(params.paths.data_root).resolve()
