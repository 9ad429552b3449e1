"""The data stages at scale: a corpus of a gigabyte and more from local text, on one small machine.

Makes JSON-lines corpora (documents of lines drawn, seeded, from the interpreter's own sources: real
text, no network) of `--small-mb` and `--large-mb`, then prints for each, every stage in a fresh
process whose tree's peak RSS is sampled from outside: the tokenizer stage's seconds (hashing the
files, the sample, BPE); token building with 1 and with 2 workers (seconds, tokens/s, tokens/s a
worker, peak RSS, shard count) and whether both gave the same shards (sha256); for the large one, a
build killed with SIGKILL half-way and carried on: the resume's seconds and whether its shards equal the
uninterrupted build's. Ratios large / small of memory and tokenizer time close the figures.

    .venv/bin/python bench/data_scale.py [--large-mb 1024] [--small-mb 100] [--shard-tokens 20000000]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from gptcore.data.build import build_token_files
from gptcore.data.config import CorpusConfig, DataConfig, TokenizerConfig
from gptcore.data.corpus import open_corpus
from gptcore.data.tokenizer import read_tokenizer_manifest, train_tokenizer

FILES = 21  # as many JSON-lines files as the corpus the issue was measured on


def tree_rss(pid: int) -> int:
    """Resident memory of a process and its children (the encoding workers), summed."""
    total = 0
    try:
        root = psutil.Process(pid)
        members = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    for member in members:
        with contextlib.suppress(psutil.Error):
            total += member.memory_info().rss
    return total


def make_corpus(folder: Path, megabytes: int, seed: int = 0) -> Path:
    """`megabytes` of JSON lines in `FILES` files: documents of 20-400 consecutive source lines."""
    folder.mkdir(parents=True, exist_ok=True)
    root = Path(sysconfig.get_paths()["stdlib"])
    lines = [
        line
        for path in sorted(root.glob("*.py"))
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines()
    ]
    rng = random.Random(seed)
    per_file = megabytes * 2**20 // FILES
    for number in range(FILES):
        with open(folder / f"part-{number:02d}.jsonl", "w", encoding="utf-8") as out:
            written = 0
            while written < per_file:
                start = rng.randrange(len(lines))
                text = "\n".join(lines[start : start + rng.randint(20, 400)])
                row = json.dumps({"text": f"# document {rng.getrandbits(48):x}\n{text}"}) + "\n"
                written += out.write(row)
    return folder


# --- one stage, in a fresh process (so no stage's memory is charged to the next) ---------------------


def stage_main(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    corpus = open_corpus(CorpusConfig(source="local", paths=[str(args.corpus)]))
    opened = time.perf_counter() - started
    if args.stage == "tokenizer":
        tokenizer = train_tokenizer(corpus, TokenizerConfig(vocab_size=args.vocab_size), args.data_root)
        result = {"folder": str(Path(tokenizer.path).parent), "sample": tokenizer.sample}
    else:
        tokenizer = read_tokenizer_manifest(args.tokenizer)
        data = DataConfig(workers=args.workers, shard_tokens=args.shard_tokens)
        built_at = time.perf_counter()
        built = build_token_files(corpus, tokenizer, args.data_root, data=data)
        result = {
            "build_seconds": round(time.perf_counter() - built_at, 1),
            "tokens": sum(split.tokens for split in built.files.values()),
            "train_shards": len(built.train.shards),
            "resumed_at_unit": built.resumed_at_unit,
            "hashes": {split: [s.sha256 for s in tokens.shards] for split, tokens in built.files.items()},
        }
    result.update(seconds=round(time.perf_counter() - started, 1), open_seconds=round(opened, 1))
    print(json.dumps(result), flush=True)


def run_stage(*arguments: str, kill_when: Any = None) -> dict[str, Any]:
    """A stage in a child process: its JSON result and the peak RSS of its process tree; `kill_when()`
    true kills it (SIGKILL to its whole group) and returns what it had done."""
    command = [sys.executable, str(Path(__file__).resolve()), *arguments]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, start_new_session=True)
    peak = 0
    while child.poll() is None:
        peak = max(peak, tree_rss(child.pid))
        if kill_when is not None and kill_when():
            os.killpg(child.pid, signal.SIGKILL)  # the build and its workers: no handler runs
            child.wait()
            return {"killed": True, "peak_rss_mib": round(peak / 2**20, 1)}
        time.sleep(0.05)
    out = child.stdout.read() if child.stdout else ""
    if child.returncode != 0:
        raise SystemExit(f"stage {arguments} failed with exit {child.returncode}")
    return {**json.loads(out.strip().splitlines()[-1]), "peak_rss_mib": round(peak / 2**20, 1)}


def half_done(data_root: Path, total: int) -> Any:
    def check() -> bool:
        journal = next((data_root / "tokens").glob(".*.building/progress.json"), None)
        if journal is None:
            return False
        try:
            return json.loads(journal.read_text())["tally"]["source_bytes"] >= total / 2
        except (json.JSONDecodeError, OSError, KeyError):
            return False

    return check


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large-mb", type=int, default=1024)
    parser.add_argument("--small-mb", type=int, default=100)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--shard-tokens", type=int, default=20_000_000, help="several shards a split")
    parser.add_argument("--work", type=Path, default=None, help="default: a temporary folder (removed)")
    parser.add_argument("--stage", choices=["tokenizer", "build"], help=argparse.SUPPRESS)
    parser.add_argument("--corpus", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--data-root", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stage:
        stage_main(args)
        return
    temporary = tempfile.TemporaryDirectory(prefix="gptpipe-data-scale-")
    work = args.work or Path(temporary.name)
    figures: dict[str, Any] = {"cores": os.cpu_count(), "load_average_at_start": os.getloadavg()[0]}
    for name, megabytes in (("small", args.small_mb), ("large", args.large_mb)):
        folder = make_corpus(work / f"corpus-{name}", megabytes, 0 if name == "small" else 1)
        size = sum(path.stat().st_size for path in folder.iterdir())
        data_root = work / f"data-{name}"
        common = ["--corpus", str(folder), "--vocab-size", str(args.vocab_size)]
        stage = run_stage("--stage", "tokenizer", *common, "--data-root", str(data_root))
        print(
            f"{name} corpus {size / 1e6:,.0f} MB: tokenizer stage {stage['seconds']} s (hashing "
            f"{stage['open_seconds']} s), peak RSS {stage['peak_rss_mib']} MiB, sample {stage['sample']}",
            flush=True,
        )
        figures.update(
            {
                f"{name}_corpus_bytes": size,
                f"{name}_tokenizer_seconds": stage["seconds"],
                f"{name}_tokenizer_peak_rss_mib": stage["peak_rss_mib"],
            }
        )
        build = [*common, "--tokenizer", stage["folder"], "--shard-tokens", str(args.shard_tokens)]
        builds = {}
        for workers in (1, 2):
            root = work / f"data-{name}-{workers}"
            builds[workers] = run_stage(
                "--stage", "build", *build, "--data-root", str(root), "--workers", str(workers)
            )
            done = builds[workers]
            rate = done["tokens"] / done["build_seconds"]
            print(
                f"  token build, {workers} worker(s): {done['build_seconds']} s, {rate / 1e6:.2f}M tokens/s "
                f"({rate / workers / 1e6:.2f}M a worker), peak RSS {done['peak_rss_mib']} MiB, "
                f"{done['train_shards']} train shards",
                flush=True,
            )
            figures.update(
                {
                    f"{name}_build_{workers}_workers_seconds": done["build_seconds"],
                    f"{name}_build_{workers}_workers_tokens_per_second": round(rate),
                    f"{name}_build_{workers}_workers_peak_rss_mib": done["peak_rss_mib"],
                }
            )
        figures[f"{name}_tokens"] = builds[1]["tokens"]
        figures[f"{name}_shards_equal_1_and_2_workers"] = builds[1]["hashes"] == builds[2]["hashes"]
        figures[f"{name}_speedup_2_over_1"] = round(
            builds[1]["build_seconds"] / builds[2]["build_seconds"], 2
        )
        if name == "small":
            continue
        killed_root = work / "data-killed"
        arguments = ["--stage", "build", *build, "--data-root", str(killed_root), "--workers", "2"]
        run_stage(*arguments, kill_when=half_done(killed_root, size))
        resumed = run_stage(*arguments)
        equal = resumed["hashes"] == builds[2]["hashes"]
        print(
            f"  killed with SIGKILL half-way, resumed at unit {resumed['resumed_at_unit']}: "
            f"{resumed['build_seconds']} s to the end; shards equal to the uninterrupted build's: {equal}",
            flush=True,
        )
        figures.update(
            resumed_at_unit=resumed["resumed_at_unit"],
            resume_seconds=resumed["build_seconds"],
            resumed_shards_equal_uninterrupted=resumed["hashes"] == builds[2]["hashes"],
        )
    for figure in ("tokenizer_peak_rss_mib", "build_2_workers_peak_rss_mib", "tokenizer_seconds"):
        figures[f"{figure}_large_over_small"] = round(
            figures[f"large_{figure}"] / figures[f"small_{figure}"], 2
        )
    figures["load_average_at_end"] = os.getloadavg()[0]
    print(json.dumps(figures))
    temporary.cleanup()


if __name__ == "__main__":
    main()
