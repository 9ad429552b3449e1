"""Kept checkpoints as MLflow logged models: linked to the run and step, loadable, predicting completions."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow.pyfunc
import pytest
from mlflow.exceptions import MlflowException
from tracking_support import tracked_training
from waiting import answers, until

from gptcore.generate import generate_text
from tasks.tracking import TrackingSession


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[TrackingSession, object, Path]:
    return tracked_training(tmp_path_factory.mktemp("logged"))


def test_the_best_and_final_checkpoints_are_logged_models_of_the_run_at_their_steps(trained) -> None:
    from gptcore.checkpoint.files import checkpoint_metadata

    session, callback, run = trained
    assert set(callback.models) == {"best", "final"}
    outputs = session.client.get_run(callback.run_id).outputs.model_outputs
    steps = {kind: checkpoint_metadata(run / f"{kind}.pt").step for kind in ("best", "final")}
    assert {(o.model_id, o.step) for o in outputs} == {(callback.models[k], steps[k]) for k in steps}
    final = session.client.get_logged_model(callback.models["final"])
    assert final.source_run_id == callback.run_id and final.tags["checkpoint_kind"] == "final"
    assert {(m.key, m.step) for m in final.metrics} >= {
        ("val_loss", 8),
        ("train_loss", 8),
        ("val_perplexity", 8),
    }


def test_a_logged_model_loads_and_completes_prompts_as_gptpipe_generate_does(trained) -> None:
    session, callback, run = trained
    model = mlflow.pyfunc.load_model(
        session.client.get_logged_model(callback.models["final"]).artifact_location
    )
    greedy = {"max_new_tokens": 6, "temperature": 0.0}
    completions = model.predict(["def load(", "import "], params=greedy)
    expected = generate_text(run, "def load(", max_new_tokens=6, temperature=0.0, checkpoint="final")
    assert len(completions) == 2 and completions[0] == expected.completion
    assert model.predict(["x"]) == model.predict(["x"])  # seeded by default: the same text again
    with pytest.raises(MlflowException, match=r"max_new_tokens 5000: allowed from 1 to 1024"):
        model.predict(["x"], params={"max_new_tokens": 5000})


def test_the_registry_moves_champion_only_to_a_better_test_figure_and_registers_a_checkpoint_once(
    trained, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tasks.tracking.models.registry import register

    session, callback, run = trained
    client, experiment = session.client, session.experiment_id
    first = register(client, experiment, callback.run_id, "gpt-registry", run / "final.pt", 2.0)
    assert (first.alias, first.model_version, first.champion_test_bits_per_byte) == ("champion", "1", None)
    assert first.model_id in callback.models.values()  # the logged model training made, found by content
    earlier = run / "step-00000004.pt"  # no logged model yet: logged now, into the given run
    worse = register(client, experiment, callback.run_id, "gpt-registry", earlier, 2.1)
    assert (worse.alias, worse.model_version, worse.champion_test_bits_per_byte) == ("challenger", "2", 2.0)
    linked = client.get_logged_model(worse.model_id).tags["mlflow.modelVersions"]
    assert json.loads(linked) == [{"name": "gpt-registry", "version": "2"}]  # the model page names it
    again = register(client, experiment, callback.run_id, "gpt-registry", earlier, 2.1)
    assert again.model_version == "2"  # the same checkpoint is one version
    champion = client.get_model_version_by_alias("gpt-registry", "champion")
    assert str(champion.version) == "1" and champion.tags["decision"] == "champion"
    tags = client.get_model_version("gpt-registry", "2").tags
    assert (tags["decision"], tags["champion_test_bits_per_byte"]) == ("challenger", "2.0")
    better = register(client, experiment, callback.run_id, "gpt-registry", earlier, 1.9)
    assert (better.alias, better.model_version) == ("champion", "2")

    monkeypatch.setenv("MLFLOW_TRACKING_URI", session.target.uri)  # models:/ URIs resolve in the store
    model = mlflow.pyfunc.load_model("models:/gpt-registry@champion")
    assert len(model.predict(["def "], params={"max_new_tokens": 3})) == 1


def test_gptpipe_generate_takes_a_model_uri_beside_a_checkpoint_directory(
    trained, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from flows.cli.main import main

    session, callback, run = trained
    monkeypatch.setenv("MLFLOW_TRACKING_URI", session.target.uri)
    greedy = ["--prompt", "def load(", "--max-new-tokens", "5", "--temperature", "0", "--json"]
    assert main(["generate", "--model", f"models:/{callback.models['final']}", *greedy]) == 0
    from_model = json.loads(capsys.readouterr().out)
    assert main(["generate", "--checkpoint-directory", str(run), "--checkpoint", "final", *greedy]) == 0
    assert from_model["completion"] == json.loads(capsys.readouterr().out)["completion"]

    assert main(["generate", "--model", "models:/gpt-registry@nobody", *greedy]) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: --model models:/gpt-registry@nobody: cannot be loaded from sqlite:///")
    assert len(error.splitlines()) == 1
    too_long = ["generate", "--model", f"models:/{callback.models['final']}", "--prompt", "x"]
    assert main([*too_long, "--max-new-tokens", "5000"]) != 0
    assert "max_new_tokens 5000: allowed from 1 to 1024" in capsys.readouterr().err
    assert main(["generate", "--prompt", "x"]) == 2
    assert "give --checkpoint-directory DIR or --model URI" in capsys.readouterr().err


@pytest.mark.slow
def test_gptpipe_serve_answers_a_logged_model_by_its_uri_and_stops_on_sigterm(trained) -> None:
    """The command a person runs: a `models:/` URI resolved in the store, its files read as data,
    OpenAI's and MLflow's bodies answered, bad requests in one sentence, SIGTERM a clean stop."""
    import os
    import signal
    import subprocess

    import httpx
    from process_support import FORKED_GPTPIPE

    session, callback, _ = trained
    env = {**os.environ, "MLFLOW_TRACKING_URI": session.target.uri}
    model = f"models:/{callback.models['final']}"
    server = subprocess.Popen(
        [*FORKED_GPTPIPE, "serve", "--model", model, "--port", "0"],  # any free one
        env=env,
        cwd=Path(__file__).resolve().parent.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = server.stdout.readline()
        assert first.startswith(f"serving {model} at http://127.0.0.1:"), first
        url = first.split(" at ")[1].split("/v1")[0]
        until(lambda: answers(f"{url}/health"), "the server answers")
        greedy = {"inputs": ["def main("], "params": {"max_new_tokens": 4, "temperature": 0}}
        answer = httpx.post(f"{url}/invocations", json=greedy, timeout=60)
        assert answer.status_code == 200 and len(answer.json()["predictions"]) == 1
        openai = httpx.post(
            f"{url}/v1/completions", json={"prompt": "def main(", "max_tokens": 4, "temperature": 0}
        )
        assert openai.json()["choices"][0]["text"] == answer.json()["predictions"][0]
        too_many = httpx.post(
            f"{url}/invocations", json={"inputs": ["x"], "params": {"max_new_tokens": 5000}}
        )
        assert too_many.status_code == 400 and too_many.json() == {
            "error_code": "INVALID_PARAMETER_VALUE",
            "message": "params.max_new_tokens: 5000 is not allowed: from 1 to 1024 "
            "(this server's cap, GET /v1/models)",
        }
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=30)
    assert code == 0 and "Traceback" not in server.stderr.read()


def test_gptpipe_export_writes_a_hugging_face_folder_from_a_checkpoint_or_a_logged_model(
    trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from safetensors.torch import load_file

    from flows.cli.main import main

    session, callback, run = trained
    monkeypatch.setenv("MLFLOW_TRACKING_URI", session.target.uri)
    from_run = ["export", "--checkpoint-directory", str(run), "--checkpoint", "final"]
    assert main([*from_run, "--output", str(tmp_path / "a")]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == "hf"
    model = f"models:/{callback.models['final']}"
    assert main(["export", "--model", model, "--output", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    names = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "README.md"}
    assert names <= {child.name for child in (tmp_path / "a").iterdir()}
    assert names <= {child.name for child in (tmp_path / "b").iterdir()}  # every export has its card
    assert "| step |" in (tmp_path / "a" / "README.md").read_text()  # what the checkpoint's record says
    first, second = (
        load_file(tmp_path / "a" / "model.safetensors"),
        load_file(tmp_path / "b" / "model.safetensors"),
    )
    assert first.keys() == second.keys() and all(first[k].equal(second[k]) for k in first)  # the same model

    assert main([*from_run, "--output", str(tmp_path / "a")]) == 2  # not empty: refused, kept
    assert "exists and is not empty; choose another folder or add --force" in capsys.readouterr().err
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not a checkpoint")
    assert main(["export", "--checkpoint-file", str(broken), "--output", str(tmp_path / "c")]) != 0
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: ") and len(error.splitlines()) == 1 and not (tmp_path / "c").exists()
    assert main(["export", "--model", model, *from_run[1:], "--output", str(tmp_path / "d")]) == 2
    assert "give one of --checkpoint-directory, --checkpoint-file or --model" in capsys.readouterr().err


def test_quantized_models_are_versions_tagged_with_their_method_and_champion_stays_on_fp32(
    trained, tmp_path: Path
) -> None:
    pytest.importorskip("torchao", reason="the quant extra is not installed")
    from gptcore.checkpoint.load import load_model
    from gptcore.export.model_files import checkpoint_tokenizer, write_model_files
    from gptcore.model.quantization import quantized
    from gptcore.tools.fingerprint import sha256_file
    from tasks.tracking.models.registry import register, register_quantized

    session, callback, run = trained
    client, experiment, name = session.client, session.experiment_id, "gpt-quantized"
    assert register(client, experiment, callback.run_id, name, run / "final.pt", 2.0).alias == "champion"
    model, record = load_model(run / "final.pt")
    digest = sha256_file(run / "final.pt")

    def files(method: str) -> object:
        return write_model_files(
            quantized(model, method), checkpoint_tokenizer(record), tmp_path / method, method
        )

    figures = {"test_bits_per_byte": 1.9, "size_ratio": 0.56}  # better than fp32's, yet not champion:
    int8 = register_quantized(
        client, experiment, callback.run_id, name, files("int8-weight-only"), digest, figures
    )
    assert (int8.alias, int8.model_version) == ("int8-weight-only", "2")
    version = client.get_model_version(name, "2")
    assert (version.tags["quantization"], version.tags["source_checkpoint_sha256"]) == (
        "int8-weight-only",
        digest,
    )
    assert str(client.get_model_version_by_alias(name, "champion").version) == "1"
    again = register_quantized(
        client, experiment, callback.run_id, name, files("int8-weight-only"), digest, figures
    )
    assert again.model_version == "2"  # one version per checkpoint and method

    logged = client.get_logged_model(version.tags["model_id"])
    assert {metric.key for metric in logged.metrics} == {"test_bits_per_byte", "size_ratio"}
    served = mlflow.pyfunc.load_model(logged.artifact_location)
    completions = served.predict(["def load("], params={"max_new_tokens": 4, "temperature": 0.0})
    assert len(completions) == 1 and isinstance(completions[0], str)

    allowed = {"test_bits_per_byte": 1.5}
    bf16 = register_quantized(client, experiment, callback.run_id, name, files("bf16"), digest, allowed, True)
    assert (bf16.alias, bf16.champion_test_bits_per_byte) == ("champion", 2.0)
    assert str(client.get_model_version_by_alias(name, "bf16").version) == bf16.model_version


def test_gptpipe_quantize_measures_a_registered_model_and_registers_its_quantized_versions(
    trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torchao", reason="the quant extra is not installed")
    from flows.cli.main import main
    from tasks.tracking.models.registry import register

    session, callback, run = trained
    register(session.client, session.experiment_id, callback.run_id, "gpt-cli", run / "final.pt", 2.0)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", session.target.uri)
    test = next(run.parent.glob("tokens/*/test.manifest.json"))
    quantize = ["quantize", "--test-tokens", str(test), "--output", str(tmp_path / "q")]
    assert main([*quantize, "--model", "models:/gpt-cli@champion", "--methods", "int8-weight-only"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert [row["method"] for row in answer["rows"]] == ["fp32", "int8-weight-only"]
    assert answer["registered"] == {"int8-weight-only": "models:/gpt-cli/2"}
    assert (tmp_path / "q" / "tradeoff.md").is_file() and (
        tmp_path / "q" / "int8-weight-only" / "model.pt"
    ).is_file()
    version = session.client.get_model_version_by_alias("gpt-cli", "int8-weight-only")
    assert version.tags["quantization"] == "int8-weight-only"

    assert main([*quantize, "--model", "models:/gpt-cli@int8-weight-only"]) == 2
    assert "already int8-weight-only; quantize the fp32 model it came from" in capsys.readouterr().err
    assert main([*quantize, "--model", "models:/gpt-cli@champion", "--methods", "int4"]) != 0
    error = capsys.readouterr().err.strip()
    assert error.endswith(
        "--methods 'int4': expected one of fp32, bf16, int8-weight-only, int8-dynamic, int4-weight-only"
    )


def test_a_registered_model_another_run_made_meanwhile_is_used(trained) -> None:
    from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST

    from tasks.tracking.models.registry import register

    session, callback, run = trained
    session.client.create_registered_model("gpt-race")  # by a sweep's other trial ...

    class LookedTooEarly:
        """... just after this run looked and found no model of that name."""

        def __init__(self, client: object) -> None:
            self.client, self.looked = client, False

        def __getattr__(self, name: str) -> object:
            return getattr(self.client, name)

        def get_registered_model(self, name: str) -> object:
            if self.looked:
                return self.client.get_registered_model(name)
            self.looked = True
            raise MlflowException(f"Registered Model with name={name} not found", RESOURCE_DOES_NOT_EXIST)

    client = LookedTooEarly(session.client)
    registration = register(client, session.experiment_id, callback.run_id, "gpt-race", run / "final.pt", 2.0)
    assert client.looked and (registration.model_version, registration.alias) == ("1", "champion")


def test_gptpipe_quantize_measures_a_model_on_its_own_test_split_and_refuses_when_it_is_gone(
    trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """After a fine-tune's text was encoded with the same tokenizer, the newest such split is not the
    model's: quantize finds the model's own by the fingerprint its version names, and says which."""
    import shutil
    import sysconfig

    from flows.cli.main import main
    from gptcore.data.build import build_token_files
    from gptcore.data.config import CorpusConfig
    from gptcore.data.corpus import open_corpus
    from gptcore.data.tokenfile import split_fingerprint
    from gptcore.data.tokenizer import read_tokenizer_manifest
    from tasks.tracking.models.registry import register
    from tasks.tracking.models.test_split import split_tags

    session, callback, run = trained
    own_folder = next(run.parent.glob("tokens/*/test.manifest.json")).parent
    data = tmp_path / "data"
    shutil.copytree(own_folder, data / "tokens" / own_folder.name)  # the model's own split
    own = data / "tokens" / own_folder.name / "test.manifest.json"
    fingerprint = split_fingerprint(own)
    client, name = session.client, "gpt-own-split"
    register(
        client, session.experiment_id, callback.run_id, name, run / "final.pt", 2.0, split=split_tags(own)
    )
    logged = client.get_logged_model(client.get_model_version(name, "1").tags["model_id"])
    assert logged.tags["test_split"] == fingerprint  # models:/<id> names its split too

    stdlib = Path(sysconfig.get_paths()["stdlib"])  # other text, encoded with the model's tokenizer: newer
    other_text = CorpusConfig(
        source="local", paths=[str(stdlib / "http" / "*.py")], validation_fraction=0.2, test_fraction=0.2
    )
    tokenizer = read_tokenizer_manifest(next((run.parent / "tokenizers").iterdir()))
    newer = Path(build_token_files(open_corpus(other_text), tokenizer, data).test.path)
    params = tmp_path / "params.yaml"
    params.write_text(f"""\
iteration: 1
model:
  name: tiny
  architecture: {{n_layer: 1, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 400}}
  cpu: {{batch_size: 4}}
  gpu: {{batch_size: 4}}
tokenizer: {{vocab_size: 400}}
corpus: {{source: local, paths: ["{tmp_path}"]}}
paths: {{data_root: "{data}", checkpoint_root: "{tmp_path / "checkpoints"}"}}
""")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", session.target.uri)
    quantize = [
        "quantize",
        "--model",
        f"models:/{name}@champion",
        "--params",
        str(params),
        "--methods",
        "bf16",
    ]
    assert main([*quantize, "--no-register", "--output", str(tmp_path / "q1")]) == 0
    said = capsys.readouterr().err
    assert f"quantize: models:/{name}@champion: measured on its own test split {own} " in said
    assert f"(test split {fingerprint})" in said and str(newer) not in said

    assert main([*quantize, "--test-tokens", str(newer), "--output", str(tmp_path / "q2")]) == 0
    said = capsys.readouterr().err
    assert f"not the model's own test split {fingerprint}" in said
    bf16 = client.get_model_version_by_alias(name, "bf16").tags  # measured elsewhere: not compared
    assert bf16["test_split"] == split_fingerprint(newer)
    assert bf16["not_compared"].startswith("not compared with the champion (version 1): measured on another")
    assert f"{name} version 2: not compared with the champion (version 1)" in said

    shutil.rmtree(own.parent)  # the model's own split is gone: no other text stands in for it
    assert main([*quantize, "--no-register", "--output", str(tmp_path / "q3")]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and error.startswith(f"error: --test-tokens: models:/{name}@champion")
    assert f"test split {fingerprint}" in error and error.endswith("or pass --test-tokens PATH")
