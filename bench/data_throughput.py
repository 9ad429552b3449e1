"""Data-stage throughput on the default corpus: tokenizer training, token building, encoder identity.

Prints tokenizer training seconds, end-to-end token building tokens/s (read, encode, write) beside
`Tokenizer.encode_batch_fast` tokens/s on the same documents in the same run, the peak RSS, and
whether the token files hold exactly the ids `encode_batch_fast` gives for every document.

    .venv/bin/python bench/data_throughput.py [--vocab-size 8192] [--repeat 2] [--data-root DIR]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gptcore.data.build import build_token_files
from gptcore.data.config import CorpusConfig, TokenizerConfig
from gptcore.data.corpus import open_corpus
from gptcore.data.documents import split_documents
from gptcore.data.encoders import make_encoder, workers
from gptcore.data.tokenfile import open_tokens
from gptcore.data.tokenizer import load_tokenizer, train_tokenizer


class PeakRss:
    """Samples this process's resident memory while a phase runs."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        process = psutil.Process()
        while not self._stop.is_set():
            self.peak = max(self.peak, process.memory_info().rss)
            self._stop.wait(0.01)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def timed(label: str, function, *args, **kwargs):
    started = time.perf_counter()
    result = function(*args, **kwargs)
    seconds = time.perf_counter() - started
    print(f"{label:<44} {seconds:8.3f} s", flush=True)
    return result, seconds


def reference_stream(tokenizer, texts: list[str], end_of_text_id: int) -> tuple[np.ndarray, float, int]:
    """`encode_batch_fast` on every document (timed alone), and the stream it implies."""
    started = time.perf_counter()
    encodings = tokenizer.encode_batch_fast(texts)
    seconds = time.perf_counter() - started
    pieces = []
    for encoding in encodings:
        pieces.append(np.asarray(encoding.ids, dtype=np.uint32))
        pieces.append(np.array([end_of_text_id], dtype=np.uint32))
    stream = np.concatenate(pieces)
    return stream, seconds, len(stream) - len(texts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--repeat", type=int, default=2, help="best of N for build and reference")
    parser.add_argument("--data-root", type=Path, default=None, help="default: a temporary folder")
    args = parser.parse_args()
    temporary = tempfile.TemporaryDirectory(prefix="gptpipe-bench-")
    data_root = args.data_root or Path(temporary.name)
    print(f"cores: {workers()}   data root: {data_root}")

    corpus, _ = timed("corpus open (hash the files, plan units)", open_corpus, CorpusConfig())
    texts_of: dict[str, list[str]] = {"train": [], "validation": [], "test": []}
    for unit in corpus.units():
        for split, document in split_documents(unit, corpus.reading):
            if split is not None:
                texts_of[split].append(document.text)
    print(f"documents: { {split: len(texts) for split, texts in texts_of.items()} }")

    with PeakRss() as training_memory:
        tokenizer, training_seconds = timed(
            f"tokenizer training (vocab {args.vocab_size})",
            train_tokenizer,
            corpus,
            TokenizerConfig(vocab_size=args.vocab_size),
            data_root,
        )

    builds = []
    with PeakRss() as build_memory:
        for _ in range(args.repeat):
            manifest, seconds = timed(
                "token files, end to end", build_token_files, corpus, tokenizer, data_root
            )
            builds.append((seconds, manifest))
    build_seconds, manifest = min(builds, key=lambda pair: pair[0])
    build_tokens = manifest.train.tokens + manifest.validation.tokens

    hf = load_tokenizer(tokenizer)
    identical = True
    reference_seconds = float("inf")
    for split in ("train", "validation"):
        texts = texts_of[split]
        best = float("inf")
        for _ in range(args.repeat):
            expected, seconds, _count = reference_stream(hf, texts, tokenizer.end_of_text_id)
            best = min(best, seconds)
        reference_seconds = best if reference_seconds == float("inf") else reference_seconds + best
        written = np.asarray(open_tokens(manifest.files[split].path).tokens, dtype=np.uint32)
        identical &= bool(np.array_equal(written, expected))
    reference_tokens = build_tokens - manifest.train.documents - manifest.validation.documents
    reference_rate = reference_tokens / reference_seconds
    print(f"{'encode_batch_fast alone (same documents)':<44} {reference_seconds:8.3f} s")

    encoder = make_encoder(tokenizer.path)
    all_texts = [*texts_of["train"], *texts_of["validation"]]
    started = time.perf_counter()
    encoder_tokens = sum(len(ids) for ids in encoder.encode_batch(all_texts))
    single_thread = encoder_tokens / (time.perf_counter() - started)

    end_to_end = build_tokens / build_seconds
    figures = {
        "documents": manifest.train.documents + manifest.validation.documents,
        "tokens": build_tokens,
        "tokenizer_training_seconds": round(training_seconds, 3),
        "build_seconds": round(build_seconds, 3),
        "build_tokens_per_second": round(end_to_end),
        "encode_batch_fast_tokens_per_second": round(reference_rate),
        "ratio_end_to_end_over_encode_batch_fast": round(end_to_end / reference_rate, 2),
        "encoder": manifest.encoder,
        "encoder_one_thread_tokens_per_second": round(single_thread),
        "ids_identical_on_whole_corpus": identical,
        "verified_during_build_documents": manifest.verified_documents,
        "peak_rss_training_mib": round(training_memory.peak / 2**20, 1),
        "peak_rss_build_mib": round(build_memory.peak / 2**20, 1),
        "peak_rss_process_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    print(f"tokens/s end to end: {end_to_end / 1e6:.2f}M ({manifest.encoder})")
    print(
        f"tokens/s encode_batch_fast: {reference_rate / 1e6:.2f}M  ratio {end_to_end / reference_rate:.2f}x"
    )
    print(f"ids identical to encode_batch_fast on every document: {identical}")
    print(json.dumps(figures))
    temporary.cleanup()
    if not identical:
        sys.exit(1)


if __name__ == "__main__":
    main()
