"""The bad-input cases, one table per kind: parameter files, command-line flags, token files and
tokenizers. Parameter files go through `gptpipe run` and `gptpipe train --dry-run`, which validate
everything before any stage or model starts."""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from gptcore.data.tokenfile import TokenFileManifest, manifest_path

from .support import ROOT, Case

ITERATION_1: dict[str, Any] = yaml.safe_load((ROOT / "params" / "iteration_1.yaml").read_text())
TINY_VOCAB = 300
TINY: dict[str, Any] = {
    "iteration": 1,
    "model": {
        "name": "tiny",
        "architecture": {"n_layer": 1, "n_head": 1, "n_embd": 16, "block_size": 8, "vocab_size": TINY_VOCAB},
        "cpu": {"batch_size": 2},
        "gpu": {"batch_size": 2},
    },
    "tokenizer": {"vocab_size": TINY_VOCAB},
}


# A fine-tune's parameter file: no tokenizer section (the base's is used), a base model to start from.
FINETUNE: dict[str, Any] = {
    **{key: value for key, value in TINY.items() if key != "tokenizer"},
    "finetune": {"name": "notes", "model": "models:/gptpipe-iteration-1@champion"},
}


class RunsCode:
    """A pickle that runs a command when it is loaded: what a model's weights must never be able to do."""

    def __reduce__(self) -> tuple:
        import os

        return os.system, ("touch ran-code-from-the-weights",)


def model_folder(folder: str, weights: dict[str, Any]) -> dict[str, Any]:
    """A model folder's files as `write_model_files` leaves them, its weights file `weights`."""
    settings = {"model_config.json": json.dumps(TINY["model"]["architecture"]), "tokenizer.json": "{}"}
    return {f"{folder}/{name}": content for name, content in {**weights, **settings}.items()}


def changed(path: str, value: Any, base: dict[str, Any] = ITERATION_1) -> str:
    """Iteration 1's parameters with `a.b.c` set to value (or removed when value is ...), as YAML."""
    data = copy.deepcopy(base)
    *sections, key = path.split(".")
    node = data
    for section in sections:
        node = node.setdefault(section, {})
    if value is ...:
        del node[key]
    else:
        node[key] = value
    return yaml.safe_dump(data, sort_keys=False)


def truncated(base: dict[str, Any] = ITERATION_1) -> str:
    """A parameter file whose write was cut off in the middle of a flow mapping."""
    text = yaml.safe_dump(base, default_flow_style=True)
    return text[: int(len(text) * 0.6)]


def run(params: str) -> list[str]:
    return ["run", "--params", params]


def finetune(params: str) -> list[str]:
    return ["finetune", "--params", params]


def dry(params: str, *more: str) -> list[str]:
    return ["train", "--params", params, "--device", "cpu", "--dry-run", "--no-track", *more]


PARAM_FILE_CASES = [
    Case(
        "finetune-trains-no-tokenizer",
        finetune("p.yaml"),
        "p.yaml: tokenizer: a fine-tune encodes its corpus with the base model's tokenizer, never a new "
        "vocabulary: remove the tokenizer section",
        {"p.yaml": changed("tokenizer.vocab_size", TINY_VOCAB, FINETUNE)},
    ),
    Case(
        "finetune-rank-zero",
        finetune("p.yaml"),
        "p.yaml: finetune.lora.r: value 0 is not allowed: Input should be greater than or equal to 1",
        {"p.yaml": changed("finetune.lora.r", 0, FINETUNE)},
    ),
    Case(
        "finetune-target-naming-no-layer",
        finetune("p.yaml"),
        "p.yaml: finetune.lora.targets: value ['attn.q_proj'] is not allowed: 'attn.q_proj' is no layer "
        "LoRA adapts: expected some of qkv, attention_output, mlp_up, mlp_down, attn.c_attn, attn.c_proj, "
        "mlp.c_fc, mlp.c_proj",
        {"p.yaml": changed("finetune.lora.targets", ["attn.q_proj"], FINETUNE)},
    ),
    Case(
        "finetune-unknown-method",
        finetune("p.yaml"),
        "p.yaml: finetune.method: value 'dora' is not allowed: Input should be 'qlora', 'lora' or 'full'",
        {"p.yaml": changed("finetune.method", "dora", FINETUNE)},
    ),
    Case(
        "finetune-of-a-pretraining-file",
        finetune("p.yaml"),
        "p.yaml: finetune: missing section: name the base model to fine-tune there",
        {"p.yaml": changed("iteration", 1)},
    ),
    Case(
        "unknown-top-level-key", run("p.yaml"), "p.yaml: bogus: unknown key", {"p.yaml": changed("bogus", 1)}
    ),
    Case(
        "unknown-nested-key",
        run("p.yaml"),
        "p.yaml: full.max_stepz: unknown key",
        {"p.yaml": changed("full.max_stepz", 10)},
    ),
    Case(
        "string-for-an-integer",
        run("p.yaml"),
        "p.yaml: full.max_steps: value 'ten' is not allowed",
        {"p.yaml": changed("full.max_steps", "ten")},
    ),
    Case(
        "string-for-a-boolean",
        run("p.yaml"),
        "p.yaml: runtime.compile: value 'yes please' is not allowed",
        {"p.yaml": changed("runtime.compile", "yes please")},
    ),
    Case(
        "list-for-a-section",
        run("p.yaml"),
        "p.yaml: smoke: value [1, 2] is not allowed",
        {"p.yaml": changed("smoke", [1, 2])},
    ),
    Case(
        "zero-steps",
        run("p.yaml"),
        "p.yaml: full.max_steps: value 0 is not allowed: Input should be greater than or equal to 1",
        {"p.yaml": changed("full.max_steps", 0)},
    ),
    Case(
        "fraction-above-one",
        run("p.yaml"),
        "p.yaml: corpus.validation_fraction: value 1.5 is not allowed: Input should be less than 1",
        {"p.yaml": changed("corpus.validation_fraction", 1.5)},
    ),
    Case(
        "negative-learning-rate",
        run("p.yaml"),
        "p.yaml: full.optimizer.learning_rate: value -0.001 is not allowed: Input should be greater than 0",
        {"p.yaml": changed("full.optimizer.learning_rate", -1e-3)},
    ),
    Case(
        "unknown-device",
        run("p.yaml"),
        "p.yaml: runtime.device: value 'tpu' is not allowed: Input should be 'auto', 'cpu', 'cuda' or 'mps'",
        {"p.yaml": changed("runtime.device", "tpu")},
    ),
    Case(
        "missing-required-key",
        run("p.yaml"),
        "p.yaml: iteration: missing required key",
        {"p.yaml": changed("iteration", ...)},
    ),
    Case(
        "unknown-model-profile",
        run("p.yaml"),
        "model profile 'gpt_9000' not found (known profiles: gpt2_124m, gpt_100m, gpt_42m, gpt_first_cpu, "
        "gpt_first_cpu_modern)",
        {"p.yaml": changed("model", "gpt_9000")},
    ),
    Case(
        "tokenizer-larger-than-model",
        run("p.yaml"),
        "p.yaml: tokenizer.vocab_size 9000 exceeds the model's vocabulary 8192",
        {"p.yaml": changed("tokenizer.vocab_size", 9000)},
    ),
    Case(
        "heads-do-not-divide-width",
        dry("p.yaml"),
        "p.yaml (with --set): model.architecture: n_embd 16 must be a multiple of n_head 3",
        {"p.yaml": changed("model.architecture.n_head", 3, TINY)},
    ),
    Case("truncated-yaml", run("p.yaml"), "p.yaml: invalid YAML at line", {"p.yaml": truncated()}),
    Case(
        "tab-indented-yaml",
        run("p.yaml"),
        "p.yaml: invalid YAML at line 2",
        {"p.yaml": "full:\n\tmax_steps: 3\n"},
    ),
    Case("empty-file", run("p.yaml"), "p.yaml: the parameter file is empty", {"p.yaml": ""}),
    Case("only-comments", dry("p.yaml"), "p.yaml: the parameter file is empty", {"p.yaml": "# nothing\n"}),
    Case(
        "binary-junk",
        run("p.yaml"),
        "p.yaml: not a text file (it is not valid UTF-8)",
        {"p.yaml": bytes(range(128, 256)) * 8},
    ),
    Case(
        "a-list-not-a-mapping",
        run("p.yaml"),
        "p.yaml: the parameter file must be a mapping of keys, found list",
        {"p.yaml": "- iteration\n- 1\n"},
    ),
    Case("missing-file", run("nowhere.yaml"), "nowhere.yaml: parameter file not found"),
    Case(
        "python-object-tag",
        run("p.yaml"),
        "p.yaml: invalid YAML at line 1, column 12: could not determine a constructor for the tag",
        {"p.yaml": 'iteration: !!python/object/apply:os.system ["touch pwned"]\n'},
    ),
    Case(
        "fractions-leaving-nothing-to-train-on",
        run("p.yaml"),
        "p.yaml: corpus: corpus.validation_fraction 0.05 + corpus.test_fraction 0.95 leave nothing to train",
        {"p.yaml": changed("corpus.test_fraction", 0.95)},
    ),
    Case(
        "local-corpus-without-paths",
        run("p.yaml"),
        "p.yaml: corpus: source 'local' needs corpus.paths",
        {"p.yaml": changed("corpus.source", "local")},
    ),
    Case(
        "init-from-in-a-finetune",
        finetune("p.yaml"),
        "p.yaml: full.init_from: a fine-tune starts from finetune.model; remove full.init_from",
        {"p.yaml": changed("full.init_from", "hf:gpt2", FINETUNE)},
    ),
    Case(
        "init-from-with-a-tokenizer-to-train",
        run("p.yaml"),
        "p.yaml: tokenizer: full.init_from's model encodes the corpus with its own tokenizer, none is "
        "trained",
        {"p.yaml": changed("full.init_from", "hf:gpt2", TINY)},
    ),
    Case(
        "init-from-no-model-there",
        run("p.yaml"),
        "full.init_from no-such-folder: no model there",
        {
            "p.yaml": changed(
                "full.init_from", "no-such-folder", {k: v for k, v in TINY.items() if k != "tokenizer"}
            )
        },
        exit_code=1,  # a model that is not there, as for --model
    ),
    Case(
        "benchmark-gate-of-an-unlisted-task",
        run("p.yaml"),
        "p.yaml: evaluate: benchmark_gate hellaswag/acc_norm: its task is not in benchmarks (listed: "
        "code_choice); name <task>/<metric> of a listed task",
        {
            "p.yaml": changed(
                "evaluate", {"benchmarks": [{"task": "code_choice"}], "benchmark_gate": "hellaswag/acc_norm"}
            )
        },
    ),
    Case(
        "benchmark-listed-twice",
        run("p.yaml"),
        "p.yaml: evaluate: benchmarks: a task is listed twice (piqa, piqa): list each once",
        {"p.yaml": changed("evaluate", {"benchmarks": [{"task": "piqa"}, {"task": "piqa", "limit": 5}]})},
    ),
    Case(
        "benchmark-tasks-folder-missing",
        run("p.yaml"),
        "evaluate.benchmark_include_path my-tasks: not a folder of task YAML files",
        {
            "p.yaml": changed(
                "evaluate", {"benchmarks": [{"task": "mine"}], "benchmark_include_path": "my-tasks"}
            )
        },
    ),
    Case(
        "benchmark-the-harness-does-not-know",
        run("p.yaml"),
        "evaluate.benchmarks my_task: not a task lm-evaluation-harness knows nor in my-tasks",
        {
            "p.yaml": changed(
                "evaluate", {"benchmarks": [{"task": "my_task"}], "benchmark_include_path": "my-tasks"}
            ),
            "my-tasks/other.yaml": "task: other\ndataset_path: json\noutput_type: loglikelihood\n",
        },
    ),
]

SMOKE_LOGS_ONE = (
    "smoke: max_steps 4 at log_every 5 logs 1 train loss; the smoke gate needs 2: set log_every to at most "
    "2 or max_steps to at least 10"
)

FLAG_CASES = [
    Case("smoke-logs-one-loss-run", ["run", "--set", "smoke.max_steps=4"], f"(with --set): {SMOKE_LOGS_ONE}"),
    Case(
        "smoke-logs-one-loss-sweep",
        ["sweep", "--set", "smoke.max_steps=4", "--grid", "full.optimizer.learning_rate=1e-3,2e-3"],
        f"(with --set): {SMOKE_LOGS_ONE}",
    ),
    Case(
        "smoke-logs-one-loss-in-a-trial",
        ["sweep", "--grid", "smoke.max_steps=10,4"],
        "smoke: max_steps 4 at log_every 5 logs 1 train loss",
    ),
    Case(
        "smoke-logs-one-loss-train",
        ["train", "--stage", "smoke", "--max-steps", "4", "--dry-run"],
        f"(with --set): {SMOKE_LOGS_ONE}",
    ),
    Case(
        "smoke-without-a-baseline",
        ["run", "--set", "smoke.eval_at_start=false"],
        "smoke: eval_at_start false: the smoke gate judges validation from the untrained model's loss on",
    ),
    Case(
        "set-wrong-type",
        ["run", "--set", "full.max_steps=abc"],
        "(with --set): full.max_steps: value 'abc' is not allowed",
    ),
    Case(
        "set-without-equals",
        ["run", "--set", "full.max_steps"],
        "--set 'full.max_steps': expected key.path=value",
    ),
    Case(
        "set-into-a-value",
        ["run", "--set", "iteration.deeper=1"],
        "--set 'iteration.deeper=1': iteration is a value, not a section",
    ),
    Case("set-unknown-key", ["run", "--set", "full.turbo=true"], "(with --set): full.turbo: unknown key"),
    Case(
        "unknown-stage",
        ["run", "--until", "banana"],
        "--until 'banana': expected one of tokenizer",
    ),
    Case(
        "params-and-iteration", ["run", "--iteration", "1", "--params", "x.yaml"], "--params and --iteration"
    ),
    Case(
        "unknown-iteration",
        ["train", "--iteration", "9", "--dry-run"],
        "--iteration 9: no parameter file iteration_9.yaml (known iterations: 1, 2, 3)",
    ),
    Case(
        "servers-state-inside-a-file",
        ["servers", "--state", "afile/state"],
        "--state afile/state: cannot make the folder ([Errno 20] Not a directory",
        files={"afile": "not a folder"},
    ),
    Case(
        "serve-not-a-gptpipe-model",
        ["serve", "--model", "other"],
        "--model other: not a gptpipe model (no model.safetensors, model_config.json, tokenizer.json",
        files={"other/MLmodel": "flavors: {python_function: {loader_module: mlflow.sklearn}}\n"},
    ),
    *(
        Case(
            f"{argv[0]}-weights-that-are-code",
            [*argv, "--model", "pickled"],
            "--model pickled: model.pt holds objects other than tensors; refused unread (not a plain "
            "weights file: a pickle that would run code)",
            files=model_folder(
                "pickled", {"model.pt": lambda path: path.write_bytes(pickle.dumps(RunsCode()))}
            ),
        )
        for argv in (
            ["serve", "--port", "5973"],
            ["generate", "--prompt", "x"],
            ["export", "--output", "out"],
            ["quantize"],
            ["benchmark", "--tasks", "hellaswag"],
        )
    ),
    Case(
        "generate-damaged-weights",
        ["generate", "--model", "damaged", "--prompt", "x"],
        "--model damaged: model.safetensors cannot be loaded as this model's weights (SafetensorError: Error "
        "while deserializing header",
        files=model_folder("damaged", {"model.safetensors": b"not a safetensors file"}),
    ),
    Case(
        "serve-reachable-without-a-key",
        ["serve", "--model", "pickled", "--host", "0.0.0.0"],
        "--host 0.0.0.0: other machines could reach the server; give --api-key KEY (or GPTPIPE_API_KEY)",
    ),
    Case(
        "serve-cuda-without-cuda",
        ["serve", "--model", "pickled", "--device", "cuda"],
        "--device cuda: CUDA is not available",
    ),
    Case(
        "servers-state-others-may-write",
        ["servers", "--state", "shared"],
        "with mode 777; it must be this user's",
        files={"shared/.keep": lambda path: (path.write_text(""), path.parent.chmod(0o777))},
    ),
    Case(
        "servers-secret-planted-as-a-link",
        ["servers", "--state", "state"],
        "state/postgres.password: a secret that is not a plain file",
        files={
            "state/postgres.password": lambda path: (
                path.parent.chmod(0o700),
                path.symlink_to("/etc/hostname"),
            )
        },
    ),
    Case(
        "hf-model-neither-a-folder-nor-on-the-hub",
        ["generate", "--model", "hf:gptpipe-tests/no-such-model", "--prompt", "x"],
        "--model hf:gptpipe-tests/no-such-model: not a folder here, and the Hugging Face hub did not give it",
        exit_code=1,
    ),
    Case(
        "hf-model-of-another-architecture",
        ["generate", "--model", "hf:llama", "--prompt", "x"],
        "llama/config.json: model_type 'llama' (LlamaForCausalLM): gptpipe holds GPT-2's layout (gpt2) only",
        files={
            "llama/config.json": json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})
        },
    ),
    Case(
        "unknown-device-flag",
        ["train", "--device", "tpu", "--dry-run"],
        "--device 'tpu': expected one of auto, cpu, cuda",
    ),
    Case(
        "unknown-precision",
        ["train", "--precision", "fp8", "--dry-run"],
        "--precision 'fp8': expected one of",
    ),
    Case(
        "unknown-training-stage",
        ["train", "--stage", "medium", "--dry-run"],
        "--stage 'medium': expected one of",
    ),
    Case(
        "zero-batch-size",
        ["train", "--batch-size", "0"],
        "--batch-size '0': expected a whole number of at least 1, or auto",
    ),
    Case(
        "word-for-a-batch-size",
        ["train", "--batch-size", "biggest"],
        "--batch-size 'biggest': expected a whole number of at least 1, or auto",
    ),
    Case(
        "effective-batch-the-batch-does-not-divide",
        ["train", "--batch-size", "3", "--effective-batch-size", "10", "--dry-run"],
        "runtime.effective_batch_size 10 is not a multiple of runtime.batch_size 3",
    ),
    Case(
        "word-for-a-number",
        ["train", "--max-steps", "many"],
        "Invalid value for '--max-steps': Input should be a valid integer",
    ),
    Case("unknown-flag", ["train", "--turbo"], "No such option: --turbo"),
    Case("unknown-command", ["trian"], "No such command 'trian'"),
    Case("flag-without-value", ["train", "--params"], "Option '--params' requires an argument"),
]


# --- token files and tokenizers -------------------------------------------------------------------


def tokens(ids: list[int] | np.ndarray, dtype: str = "uint16", manifest: dict[str, Any] | None = None) -> Any:
    """A maker of a token stream, with a manifest beside it when given (fields over sound defaults)."""
    array = np.asarray(ids, dtype=dtype)

    def make(path: Path) -> None:
        array.tofile(path)
        if manifest is not None:
            fields = dict(
                dtype=dtype,
                token_count=len(array),
                document_count=1,
                vocab_size=TINY_VOCAB,
                tokenizer_sha256="",
                corpus_fingerprint="test",
                split="train",
                sha256="",
            )
            fields.update(manifest)
            manifest_path(path).write_text(TokenFileManifest(**fields).to_json())

    return make


def tokenizer(size: int) -> Any:
    def make(path: Path) -> None:
        from tokenizers import Tokenizer, models

        vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, size)}}
        Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]")).save(str(path))

    return make


GOOD_IDS = np.arange(9 * 8) % TINY_VOCAB


def uint16_stream_claiming_uint32(path: Path) -> None:
    """73 uint16 ids (146 bytes) under a manifest that says uint32: the byte count gives it away."""
    tokens([*GOOD_IDS, 1], manifest={"dtype": "uint32", "token_count": 73})(path)
    np.asarray([*GOOD_IDS, 1], dtype="uint16").tofile(path)


TINY_YAML = yaml.safe_dump(TINY)


def train_on(train: str, *more: str) -> list[str]:
    return dry("tiny.yaml", "--train-tokens", train, *more)


TOKEN_CASES = [
    Case(
        "missing-token-file",
        train_on("absent.bin"),
        "absent.bin: token file not found",
        {"tiny.yaml": TINY_YAML},
    ),
    Case(
        "odd-byte-count",
        train_on("odd.bin"),
        "odd.bin: 145 bytes is not a whole number of uint16 tokens",
        {"tiny.yaml": TINY_YAML, "odd.bin": b"\x01\x00" * 72 + b"\x01"},
    ),
    Case(
        "empty-token-file",
        train_on("empty.bin"),
        "empty.bin: token file is empty",
        {"tiny.yaml": TINY_YAML, "empty.bin": b""},
    ),
    Case(
        "count-disagrees-with-manifest",
        train_on("short.bin"),
        "short.bin: holds 72 uint16 tokens but its manifest says 100",
        {"tiny.yaml": TINY_YAML, "short.bin": tokens(GOOD_IDS, manifest={"token_count": 100})},
    ),
    Case(
        "dtype-disagrees-with-manifest",
        train_on("wide.bin"),
        "wide.bin: 146 bytes is not a whole number of uint32 tokens",
        {"tiny.yaml": TINY_YAML, "wide.bin": uint16_stream_claiming_uint32},
    ),
    Case(
        "unreadable-manifest",
        train_on("junk.bin"),
        "junk.bin.manifest.json: unreadable token-file manifest",
        {"tiny.yaml": TINY_YAML, "junk.bin": tokens(GOOD_IDS), "junk.bin.manifest.json": "{not json"},
    ),
    Case(
        "manifest-vocabulary-beyond-the-model",
        train_on("big.bin"),
        "big.bin: tokenizer vocabulary 8192 exceeds the model's vocab_size 300",
        {"tiny.yaml": TINY_YAML, "big.bin": tokens(GOOD_IDS, manifest={"vocab_size": 8192})},
    ),
    Case(
        "ids-beyond-the-vocabulary",
        train_on("far.bin"),
        "far.bin: token id 5000 is outside the model's vocabulary (< 300)",
        {"tiny.yaml": TINY_YAML, "far.bin": tokens([*GOOD_IDS[:-1], 5000])},
    ),
    Case(
        "corrupted-pt-file",
        train_on("bad.pt"),
        "bad.pt: not a loadable .pt tensor file",
        {"tiny.yaml": TINY_YAML, "bad.pt": b"PK\x03\x04 not really a zip archive"},
    ),
    Case(
        "tokenizer-larger-than-the-model",
        train_on("ok.bin", "--tokenizer", "tokenizer.json"),
        "tokenizer.json: tokenizer vocabulary 400 exceeds the model's vocab_size 300",
        {"tiny.yaml": TINY_YAML, "ok.bin": tokens(GOOD_IDS), "tokenizer.json": tokenizer(400)},
    ),
    Case(
        "tokenizer-other-than-the-tokens-were-made-with",
        train_on("ok.bin", "--tokenizer", "tokenizer.json"),
        "ok.bin: made with tokenizer sha256 abababababab..., not tokenizer.json",
        {
            "tiny.yaml": TINY_YAML,
            "ok.bin": tokens(GOOD_IDS, manifest={"tokenizer_sha256": "ab" * 32}),
            "tokenizer.json": tokenizer(200),
        },
    ),
    Case(
        "tokenizer-not-json",
        train_on("ok.bin", "--tokenizer", "tokenizer.json"),
        "tokenizer.json: not a loadable tokenizer.json",
        {"tiny.yaml": TINY_YAML, "ok.bin": tokens(GOOD_IDS), "tokenizer.json": json.dumps({"vocab": [1, 2]})},
    ),
]

ALL_CASES = PARAM_FILE_CASES + FLAG_CASES + TOKEN_CASES
