"""The GPT-2 way, every step timed on this machine: a GPT-2-124M-shaped model (GPT-2's architecture,
a byte-level BPE of GPT-2's 50,257 tokens with `<|endoftext|>`, a 1,024-token window) saved by
transformers itself, then imported, benchmarked, continued-pretrained through every pipeline stage
(`full.init_from`), fine-tuned with QLoRA, benchmarked again and served.

No hub here: the weights are random (sizes, memory and speeds are real; the quality figures only say the
stages ran) and the tokenizer is trained on the interpreter's standard library. Where the hub is
reachable, `--from hf:gpt2` walks the same steps with OpenAI's weights.

Each step is the command a person types (docs/finetune.md's walk-through); the script prints one JSON
line per step (its wall seconds, exit code, the figures it reported) and a Markdown table at the end.

    .venv/bin/python bench/gpt2_walkthrough.py [--work /tmp/gpt2-walk] [--from hf:gpt2] [--steps 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GPTPIPE = str(Path(sys.executable).with_name("gptpipe"))
TASKS = REPO / "tests" / "fixtures" / "lm_eval_tasks"
GPT2_VOCAB = 50257


def utf8(path: Path) -> bool:
    try:
        path.read_text(encoding="utf-8")
        return True
    except (UnicodeDecodeError, OSError):  # a few of the standard library's tests are Latin-1 on purpose
        return False


def gpt2_folder(folder: Path) -> Path:
    """GPT-2 small's shape saved by transformers, with GPT-2-format tokenizer files (vocab.json and
    merges.txt of 50,256 merges' tokens plus `<|endoftext|>`), trained on the standard library."""
    import torch
    import transformers
    from tokenizers import ByteLevelBPETokenizer

    if (folder / "config.json").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    sources = [str(path) for path in Path(sysconfig.get_paths()["stdlib"]).rglob("*.py") if utf8(path)]
    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train(sources, vocab_size=GPT2_VOCAB - 1, min_frequency=2, special_tokens=[])
    tokenizer.save_model(str(folder))
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=12, n_head=12, n_embd=768, n_positions=1024, vocab_size=GPT2_VOCAB
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


@dataclass
class Walk:
    """Where the walk keeps its files and store, and the timed rows so far."""

    work: Path
    rows: list[dict] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "MLFLOW_TRACKING_URI": f"sqlite:///{self.work / 'mlflow.db'}",
            "HF_HUB_OFFLINE": "1",
        }

    def timed(self, name: str, seconds: float, code: int = 0) -> None:
        self.rows.append({"step": name, "seconds": round(seconds, 2), "exit": code})

    def step(self, name: str, command: list[str]) -> dict:
        """Run one command: its wall time and exit code as a row; its last JSON line returned and kept
        whole as `<work>/<step>.json`."""
        started = time.perf_counter()
        done = subprocess.run(command, cwd=REPO, env=self.env, capture_output=True, text=True)
        self.timed(name, time.perf_counter() - started, done.returncode)
        lines = reversed(done.stdout.splitlines())
        reported = next((json.loads(line) for line in lines if line.startswith("{")), {})
        error = (done.stderr.strip().splitlines() or ["?"])[-1][:300] if done.returncode else None
        print(json.dumps({**self.rows[-1], "command": " ".join(command[1:]), "error": error}), flush=True)
        if reported:
            slug = "-".join(name.replace("(", "").split()[:2])
            (self.work / f"{slug}.json").write_text(
                json.dumps(reported, indent=1, default=str), encoding="utf-8"
            )
        return reported


def bounded(work: Path, steps: int, *more: str) -> list[str]:
    """`--set` options that keep a run's files under `work` and its training and evaluation short."""
    settings = [
        f"paths.data_root={work / 'data'}",
        f"paths.checkpoint_root={work / 'checkpoints'}",
        f"tracking.artifact_root={work / 'artifacts'}",
        "runtime.device=cpu",
        "smoke.max_steps=4",
        "smoke.log_every=2",
        "smoke.eval_every=4",
        "smoke.validation_examples=4",
        f"full.max_steps={steps}",
        "full.log_every=2",
        f"full.eval_every={steps}",
        f"full.checkpoint_every={steps}",
        "full.validation_examples=4",
        "evaluate.max_tokens=4096",
        "evaluate.prompts=1",
        "evaluate.max_new_tokens=8",
        *more,
    ]
    return [item for assignment in settings for item in ("--set", assignment)]


def finetune(walk: Walk, steps: int) -> bool:
    """QLoRA on GPT-2 from the registry (the imported version), the Python tutorial as the new text."""
    docs = Path("/usr/share/doc/python3.11/html/_sources/tutorial")
    text = docs if docs.is_dir() else Path(sysconfig.get_paths()["stdlib"]) / "email"
    overrides = bounded(walk.work, steps, f"corpus.paths=[{text}]")
    command = [
        GPTPIPE,
        "finetune",
        "--params",
        "params/finetune_gpt2.yaml",
        "--model",
        "models:/gpt2-local@imported",
    ]
    report = walk.step("fine-tune (QLoRA, every stage)", [*command, *overrides, "--json"])
    code = walk.rows[-1]["exit"]
    for name, seconds in stage_seconds(report.get("methods", {}).get("qlora", {})).items():
        walk.timed(f"  stage {name}", seconds)
    return code == 0


def serve(walk: Walk, model: str, port: int = 5097) -> None:
    """`gptpipe serve` until it answers /health, then one completion; the server stopped after."""
    import urllib.request

    started = time.perf_counter()
    log = (walk.work / "serve.log").open("w")  # the server's lines: a pipe nobody reads would fill up
    server = subprocess.Popen(
        [GPTPIPE, "serve", "--model", model, "--port", str(port), "--device", "cpu"],
        cwd=REPO, env=walk.env, stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip
    try:
        while time.perf_counter() - started < 300:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
                break
            except OSError:
                if server.poll() is not None:
                    raise SystemExit(f"serve exited: see {walk.work / 'serve.log'}") from None
                time.sleep(0.5)
        walk.timed("serve: ready", time.perf_counter() - started)
        body = json.dumps({"prompt": "def main(", "max_tokens": 32, "temperature": 0}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"}
        )
        asked = time.perf_counter()
        answer = json.loads(urllib.request.urlopen(request, timeout=120).read())
        walk.timed("serve: one completion of 32 tokens", time.perf_counter() - asked)
        print(json.dumps({"step": "serve", "answer": answer.get("choices", [{}])[0].get("text", "")[:80]}))
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def stage_seconds(report: dict) -> dict[str, float]:
    return {stage["name"]: stage.get("seconds", 0.0) for stage in report.get("stages", [])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpt2-walkthrough"))
    parser.add_argument("--from", dest="source", default=None, help="a model URI (default: built here)")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps of each training stage")
    arguments = parser.parse_args()
    work = arguments.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    walk = Walk(work)
    started = time.perf_counter()
    source = arguments.source or f"hf:{gpt2_folder(work / 'gpt2')}"
    walk.timed("make the GPT-2 folder", time.perf_counter() - started)
    steps = arguments.steps
    walk.step("import", [GPTPIPE, "import", source, "--name", "gpt2-local"])
    benchmark = ["--tasks", "code_choice,code_continuation", "--include-path", str(TASKS)]
    walk.step("benchmark before", [GPTPIPE, "benchmark", "--model", source, *benchmark])
    overrides = bounded(
        work,
        steps,
        f"full.init_from={source}",
        "corpus.source=local",
        f"corpus.paths=[{Path(sysconfig.get_paths()['stdlib']) / 'asyncio'}]",
        "corpus.validation_fraction=0.1",
        "corpus.test_fraction=0.1",
        "evaluate.benchmarks=[{task: code_choice}, {task: code_continuation}]",
        f"evaluate.benchmark_include_path={TASKS}",
        "evaluate.benchmark_gate=null",
        "quantize.max_test_tokens=2048",
        "quantize.new_tokens=8",
        "quantize.repeats=1",
    )
    report = walk.step(
        "continued pretraining (every stage)",
        [GPTPIPE, "run", "--params", "params/continue_gpt2.yaml", *overrides, "--json"],
    )
    for name, seconds in stage_seconds(report).items():
        walk.timed(f"  stage {name}", seconds)
    tuned = finetune(walk, steps)
    after = "models:/gptpipe-iteration-1-gpt2-docs@champion"
    if tuned:
        walk.step("benchmark after", [GPTPIPE, "benchmark", "--model", after, *benchmark])
        serve(walk, after)
    print("\n| step | seconds | exit |\n|---|---:|---:|")
    for row in walk.rows:
        print(f"| {row['step']} | {row['seconds']} | {row['exit']} |")


if __name__ == "__main__":
    main()
