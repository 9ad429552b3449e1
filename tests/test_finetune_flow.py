"""`gptpipe finetune`, for real: a tiny model pretrained and registered by `gptpipe run`, then fine-tuned
on other text with LoRA and with every weight, side by side; registered with its lineage, cached on a
second run, and bad bases refused in one line before anything trains. The parameter file names no model:
the base's own files say its architecture, so the same file fine-tunes a base of the modern recipe."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import in_process
import pytest
import torch

from tests.conftest import commands_env
from tests.test_pipeline import gptpipe, write_corpus, write_params
from tests.test_pipeline_recipes import modern_params

pytestmark = pytest.mark.slow

# The new text: sentences of one shape, which the base (trained on random word salad) has not seen.
NOTES = [
    f"note {i}: the service restarts when the queue is empty and the worker is idle." for i in range(400)
]


def finetune_params(root: Path) -> Path:
    """A fine-tune of the registered base on the notes. No model section: the base's architecture is
    taken from its files; the batch is the runtime's, as no shipped profile is this tiny."""
    (root / "notes").mkdir(exist_ok=True)
    for index in range(8):
        (root / "notes" / f"n{index}.txt").write_text("\n".join(NOTES[index * 50 : (index + 1) * 50]) + "\n")
    text = f"""\
iteration: 1
finetune:
  name: notes
  model: models:/gptpipe-iteration-1@champion
  method: lora
  lora: {{r: 4, alpha: 16, dropout: 0.0, targets: [attn.c_attn, mlp.c_fc]}}
corpus: {{source: local, paths: ["{root / "notes"}"], validation_fraction: 0.25, test_fraction: 0.25}}
runtime: {{device: cpu, cpu: {{batch_size: 4}}}}
smoke: {{max_steps: 8, log_every: 4, eval_every: 8, validation_examples: 8}}
full: {{max_steps: 16, log_every: 4, eval_every: 8, checkpoint_every: 8, validation_examples: 8,
       optimizer: {{learning_rate: 1.0e-2, warmup_steps: 1, weight_decay: 0.0}}}}
tracking: {{experiment: test-finetune, artifact_root: "{root / "mlartifacts"}"}}
paths: {{data_root: "{root / "data"}", checkpoint_root: "{root / "checkpoints"}"}}
"""
    path = root / "finetune.yaml"
    path.write_text(text)
    return path


# The pretraining (test_pipeline.gptpipe), fine-tuning and export commands go in-process
# (tests/in_process.py): what is under test is what they register, report and write.
def finetune(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return in_process.gptpipe(env, "finetune", *args)


def reports(result: subprocess.CompletedProcess[str]) -> list[dict[str, dict]]:
    """Each method's stage report (its JSON line), stage name -> stage."""
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"stages"')]
    return [{stage["name"]: stage for stage in line["stages"]} for line in lines]


@dataclass
class Workspace:
    root: Path
    env: dict[str, str]
    params: Path
    first: subprocess.CompletedProcess[str]
    second: subprocess.CompletedProcess[str]

    @property
    def summary(self) -> dict[str, Any]:
        return json.loads(self.first.stdout.strip().splitlines()[-1])

    def client(self) -> Any:
        from mlflow import MlflowClient

        return MlflowClient(tracking_uri=self.env["MLFLOW_TRACKING_URI"])


@pytest.fixture(scope="module")
def workspace(prefect_server: str, tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    root = tmp_path_factory.mktemp("finetune")
    env = commands_env(prefect_server, tmp_path_factory)
    write_corpus(root)
    gptpipe(env, "--params", str(write_params(root)), "--until", "evaluate")  # the base, registered
    params = finetune_params(root)
    first = finetune(env, "--params", str(params))
    assert first.returncode == 0, first.stderr[-3000:]
    second = finetune(env, "--params", str(params), "--set", "finetune.compare=false")  # LoRA's again
    assert second.returncode == 0, second.stderr[-3000:]
    return Workspace(root, env, params, first, second)


def test_lora_and_full_fine_tuning_are_measured_side_by_side(workspace: Workspace) -> None:
    lora, full = (workspace.summary["methods"][method] for method in ("lora", "full"))
    assert lora["state"] == full["state"] == "completed"
    assert lora["trainable_parameter_count"] < full["trainable_parameter_count"] / 10
    assert full["trainable_parameter_share"] == 1.0 and lora["trainable_parameter_share"] < 0.1
    assert lora["optimizer_state_bytes"] < full["optimizer_state_bytes"] / 10  # moments of the adapters
    for method in (lora, full):
        assert method["new_test_bits_per_byte_after"] < method["new_test_bits_per_byte_before"], "learned"
        assert method["base_test_bits_per_byte_before"] is not None, "the base's own test split, found"
        assert method["training_peak_memory_bytes"] > 0 and method["tokens_per_second"] > 0
    assert "| lora |" in workspace.first.stderr and "| full |" in workspace.first.stderr
    client = workspace.client()
    comparison = client.get_run(workspace.summary["comparison_run_id"])
    logged = {artifact.path for artifact in client.list_artifacts(comparison.info.run_id)}
    assert {"finetune_comparison.json", "finetune_comparison.md"} <= logged


def test_both_are_registered_with_their_lineage_and_the_better_is_champion(workspace: Workspace) -> None:
    client = workspace.client()
    versions = {
        v.tags["finetune.method"]: v
        for v in client.search_model_versions("name = 'gptpipe-iteration-1-notes'")
    }
    assert set(versions) == {"lora", "full"}
    base = client.get_model_version_by_alias("gptpipe-iteration-1", "champion")
    for version in versions.values():
        assert version.tags["base_model_uri"] == "models:/gptpipe-iteration-1@champion"
        assert version.tags["base_model_version"] == str(base.version)
    assert versions["lora"].tags["lora.r"] == "4" and "lora.r" not in versions["full"].tags
    experiment = client.get_experiment_by_name("test-finetune").experiment_id
    runs = client.search_runs([experiment], "tags.kind = 'finetune-method'")
    assert {run.data.params["finetune.method"] for run in runs} == {"lora", "full"}  # compared by them
    assert {run.data.params.get("lora.r") for run in runs} == {"4", None}
    champion = client.get_model_version_by_alias("gptpipe-iteration-1-notes", "champion")
    best = min(versions.values(), key=lambda v: float(v.tags["test_bits_per_byte"]))
    assert champion.version == best.version


def test_the_registered_lora_model_is_the_base_plus_its_kept_adapter(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    from gptcore.export.model_files import model_files_in
    from tasks.tracking.models.model_uri import model_files_of

    lora = reports(workspace.first)[0]
    adapter_file = next(Path(p) for p in lora["merge"]["outputs"] if p.endswith("adapter.safetensors"))
    settings = json.loads(adapter_file.with_name("adapter_config.json").read_text())
    adapter = load_file(adapter_file)
    base = load_file(model_files_in(Path(lora["base"]["outputs"][0])).weights)
    version = lora["evaluate"]["figures"]["model_version"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", workspace.env["MLFLOW_TRACKING_URI"])
    merged = load_file(model_files_of(f"models:/gptpipe-iteration-1-notes/{version}", into=tmp_path).weights)
    layer = "transformer.h.0.mlp.c_fc"
    update = adapter[f"{layer}.lora_b"] @ adapter[f"{layer}.lora_a"] * settings["alpha"] / settings["r"]
    assert torch.allclose(merged[f"{layer}.weight"], base[f"{layer}.weight"] + update, atol=1e-6)
    assert torch.equal(
        merged["transformer.h.0.attn.c_proj.weight"], base["transformer.h.0.attn.c_proj.weight"]
    )


def test_lora_checkpoints_are_merged_by_their_own_stage_and_full_ones_read_as_trained(
    workspace: Workspace,
) -> None:
    lora, full = reports(workspace.first)
    merged = [Path(path) for path in lora["merge"]["outputs"] if path.endswith(".pt")]
    assert merged and all(path.parent.name == "merged" for path in merged)
    assert lora["merge"]["figures"]["merged_checkpoints"] == len(merged)
    assert full["merge"]["state"] == "completed" and full["merge"]["figures"]["merged_checkpoints"] == 0
    client = workspace.client()
    version = client.get_model_version(
        "gptpipe-iteration-1-notes", lora["evaluate"]["figures"]["model_version"]
    )
    assert client.get_run(version.run_id).data.tags["stage"] == "merge", (
        "the merged model, logged by its stage"
    )


def test_a_second_run_takes_every_stage_but_the_base_from_the_cache(workspace: Workspace) -> None:
    assert len(reports(workspace.second)) == 1
    for report in reports(workspace.second):
        states = {name: stage["state"] for name, stage in report.items()}
        assert states.pop("base") == "completed" and states.pop("device") == "completed"
        assert set(states.values()) == {"cached"}, states


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--model", "models:/gptpipe-iteration-1@nobody"],
            "finetune.model models:/gptpipe-iteration-1@nobody: cannot be loaded",
        ),
        (
            ["--set", "model=tiny", "--set", "model.architecture.n_embd=64"],
            "model.architecture: n_embd 64 is not the architecture of finetune.model "
            "models:/gptpipe-iteration-1@champion (n_embd 32); remove the model section",
        ),
        (
            ["--set", "finetune.lora.r=64"],
            "finetune.lora.r: value 64 is not allowed: at most 32",
        ),
    ],
    ids=["unresolvable-uri", "another-shape", "rank-above-the-layer"],
)
def test_a_base_that_does_not_fit_is_refused_in_one_line(
    workspace: Workspace, args: list[str], expected: str
) -> None:
    result = finetune(workspace.env, "--params", str(workspace.params), *args)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], result.stderr


# --- a base of the modern recipe, fine-tuned with the same parameter file ------------------------------


@pytest.fixture(scope="module")
def modern(workspace: Workspace) -> subprocess.CompletedProcess[str]:
    """The notes fine-tune (LoRA) of a base pretrained in the modern recipe (rotary, RMSNorm, QK-norm,
    SwiGLU, no biases, an untied head) and registered as tiny-modern: the README's second recipe."""
    root, env = workspace.root, workspace.env
    recipe = modern_params(root, write_params(root))
    gptpipe(
        env, "--params", str(recipe), "--until", "evaluate", "--set", "tracking.registered_model=tiny-modern"
    )
    settings = ["--set", "finetune.name=notes-modern", "--set", "finetune.compare=false"]
    return finetune(
        env, "--params", str(workspace.params), "--model", "models:/tiny-modern@champion", *settings
    )


def test_the_same_file_fine_tunes_a_base_of_the_modern_recipe_on_its_own_architecture(
    workspace: Workspace, modern: subprocess.CompletedProcess[str]
) -> None:
    from safetensors.torch import load_file

    assert modern.returncode == 0, modern.stderr[-3000:]
    (lora,) = reports(modern)
    states = {name: stage["state"] for name, stage in lora.items()}
    # Both bases have the tokenizer the two recipes share: the notes' token files are the first run's.
    assert states == {**dict.fromkeys(lora, "completed"), "tokens": "cached"}, states
    figures = lora["before-after"]["figures"]
    assert figures["new_test_bits_per_byte_after"] < figures["new_test_bits_per_byte_before"], "learned"
    adapter = load_file(next(p for p in lora["merge"]["outputs"] if p.endswith("adapter.safetensors")))
    # The file's targets are the same layers in both recipes: attention's fused query/key/value projection
    # and the MLP's input, here SwiGLU's gate and up side by side: 2 x 128 (2/3 of 4 x 32, rounded up to 64).
    shapes = {name: tuple(tensor.shape) for name, tensor in adapter.items()}
    assert shapes == {
        "transformer.h.0.attn.c_attn.lora_a": (4, 32),
        "transformer.h.0.attn.c_attn.lora_b": (96, 4),
        "transformer.h.0.mlp.c_fc.lora_a": (4, 32),
        "transformer.h.0.mlp.c_fc.lora_b": (256, 4),
    }
    client = workspace.client()
    version = client.get_model_version_by_alias("gptpipe-iteration-1-notes-modern", "champion")
    assert version.tags["base_model_uri"] == "models:/tiny-modern@champion"
    flow_run = client.get_run(client.get_run(version.run_id).data.tags["mlflow.parentRunId"])
    assert flow_run.data.params["model.recipe"] == "rotary+rmsnorm+qk_norm+swiglu+untied", "the base's"


def test_the_registered_fine_tune_exports_its_adapter_in_peft_format_and_the_base_it_applies_to(
    workspace: Workspace, modern: subprocess.CompletedProcess[str], tmp_path: Path
) -> None:
    """`gptpipe export --format peft` of a registered LoRA fine-tune (Qwen3's layout: the fused linears
    split), loaded by `peft` onto `--format hf-base`, computes what `--format hf` (the merged model) does;
    a registered model that is no fine-tune is refused in one line."""
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    uri = "models:/gptpipe-iteration-1-notes-modern@champion"
    folders = {part: tmp_path / part for part in ("hf", "peft", "hf-base")}
    for part, folder in folders.items():
        export = ("export", "--model", uri, "--format", part, "--output", str(folder))
        done = in_process.gptpipe(workspace.env, *export)
        assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((folders["peft"] / "adapter_config.json").read_text())["target_modules"] == [
        "mlp.gate_proj", "mlp.up_proj", "self_attn.k_proj", "self_attn.q_proj", "self_attn.v_proj"
    ]  # fmt: skip
    load = transformers.AutoModelForCausalLM.from_pretrained
    merged = load(folders["hf"], local_files_only=True).eval()
    tuned = peft.PeftModel.from_pretrained(load(folders["hf-base"], local_files_only=True), folders["peft"])
    ids = torch.randint(0, merged.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (merged(ids).logits - tuned.eval()(ids).logits).abs().max().item() < 1e-4
    refused = in_process.gptpipe(
        workspace.env, "export", "--model", "models:/tiny-modern@champion", "--format", "peft",
        "--output", str(tmp_path / "none"),
    )  # fmt: skip
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == (
        "error: --model models:/tiny-modern@champion: its files hold no adapter (not a LoRA or QLoRA "
        "fine-tune's merged model); --format peft takes one"
    )


def test_a_model_section_that_contradicts_the_base_is_one_line_naming_the_file_and_both_values(
    workspace: Workspace, modern: subprocess.CompletedProcess[str]
) -> None:
    result = finetune(
        workspace.env, "--params", str(workspace.params), "--model", "models:/tiny-modern@champion",
        "--set", "model=tiny",
    )  # fmt: skip
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: {workspace.params}: model.architecture: bias True, position learned, norm layernorm, "
        "qk_norm False, mlp gelu, tie_embeddings True is not the architecture of finetune.model "
        "models:/tiny-modern@champion (bias False, position rotary, norm rmsnorm, qk_norm True, mlp swiglu, "
        "tie_embeddings False); remove the model section to train the model's own"
    ]


# --- a chat fine-tune: a base taught to answer in the chat template ------------------------------------


def chat_params(root: Path) -> Path:
    """A chat fine-tune (LoRA, the embedding too) of a base with a window long enough for a question and
    its answer, on conversations of the standard library's docstrings (short answers, no system
    message: the tiny base's window), from a local JSON-lines file."""
    import sysconfig

    from gptcore.chat import docstrings
    from gptcore.chat.conversations import Conversation, write

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [stdlib / name for name in ("base64.py", "bisect.py", "colorsys.py", "shlex.py", "glob.py")]
    found = docstrings.build(files, stdlib, 0.0, 0.0)["train"]
    short = [Conversation(c.messages[1:]) for c in found if len(c.messages[-1].content) <= 60]
    write(short, root / "conversations.jsonl")
    text = f"""\
iteration: 1
finetune:
  name: chat
  model: models:/tiny-long@champion
  method: lora
  compare: false
  format: chat
  lora: {{r: 8, alpha: 16, dropout: 0.0, targets: [attn.c_attn, mlp.c_fc]}}
chat: {{source: local, paths: ["{root / "conversations.jsonl"}"],
       validation_fraction: 0.2, test_fraction: 0.2}}
runtime: {{device: cpu, cpu: {{batch_size: 4}}}}
smoke: {{max_steps: 4, log_every: 2, eval_every: 4, validation_examples: 4}}
full: {{max_steps: 40, epochs: 40, log_every: 10, eval_every: 20, checkpoint_every: 20,
       validation_examples: 4, optimizer: {{learning_rate: 1.0e-2, warmup_steps: 2, weight_decay: 0.0}}}}
evaluate: {{questions: 8}}
tracking: {{experiment: test-finetune, artifact_root: "{root / "mlartifacts"}"}}
paths: {{data_root: "{root / "data"}", checkpoint_root: "{root / "checkpoints"}"}}
"""
    path = root / "chat.yaml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def chat(workspace: Workspace) -> subprocess.CompletedProcess[str]:
    """The chat fine-tune of a tiny base of a 128-token window, pretrained and registered as tiny-long."""
    root, env = workspace.root, workspace.env
    profile = (root / "profiles" / "tiny.yaml").read_text().replace("name: tiny", "name: tiny_long")
    (root / "profiles" / "tiny_long.yaml").write_text(profile.replace("block_size: 32", "block_size: 128"))
    long = root / "long.yaml"
    long.write_text(write_params(root).read_text().replace("model: tiny", "model: tiny_long"))
    gptpipe(env, "--params", str(long), "--until", "evaluate", "--set", "tracking.registered_model=tiny-long")
    return finetune(env, "--params", str(chat_params(root)))


def test_a_chat_fine_tune_learns_the_answers_and_registers_a_model_that_carries_its_template(
    workspace: Workspace,
    chat: subprocess.CompletedProcess[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tokenizers import Tokenizer

    from gptcore.chat import template
    from tasks.tracking.models.model_uri import model_files_of

    assert chat.returncode == 0, chat.stderr[-3000:]
    (report,) = reports(chat)
    assert report["base"]["figures"]["base_model_uri"] == "models:/tiny-long@champion"
    tokens = report["tokens"]["figures"]
    assert tokens["train_conversations"] > 0 and tokens["test_conversations"] > 0
    assert 0 < tokens["train_trained_tokens"] < tokens["train_tokens"], "the answers alone are targets"
    figures = report["before-after"]["figures"]
    assert figures["new_test_bits_per_byte_after"] < figures["new_test_bits_per_byte_before"], "learned"
    assert 0 <= figures["new_test_answer_score_after"] <= 1 and figures["new_test_questions"] > 0
    assert figures["base_test_bits_per_byte_before"] is not None, "forgetting, on the base's own text"
    assert "held-out answers starting right" in chat.stderr
    client = workspace.client()
    version = client.get_model_version_by_alias("gptpipe-iteration-1-chat", "champion")
    assert version.tags["finetune.format"] == "chat" and version.tags["lora.train_embedding"] == "True"
    assert version.tags["base_model_uri"] == "models:/tiny-long@champion"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", workspace.env["MLFLOW_TRACKING_URI"])
    files = model_files_of("models:/gptpipe-iteration-1-chat@champion", into=tmp_path)
    assert (files.tokenizer.parent / template.CHAT_TEMPLATE_FILE).read_text() == template.JINJA
    assert template.has_chat_tokens(Tokenizer.from_file(str(files.tokenizer)))
    answers = Path(next(p for p in report["before-after"]["outputs"] if p.endswith("answers.md")))
    assert answers.read_text().startswith("# Held-out questions, answered before and after")
