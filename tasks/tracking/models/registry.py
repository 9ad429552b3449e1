"""The model registry: the evaluated checkpoint as a version of `gptpipe-iteration-N`, and who is champion.

The evaluated checkpoint's logged model (found by its checkpoint's sha256, logged now when training
logged none, e.g. trained untracked) becomes a version of the registered model; registering the same
checkpoint again finds its version instead of adding one. The alias `champion` moves to it only when its
`test_bits_per_byte` beats the current champion's (or there is none); otherwise it gets `challenger`. The
decision and both figures are tags of the version.

The quantize stage's models are versions too, tagged `quantization=<method>` and
`source_checkpoint_sha256`, each with the alias of its method (`@int8-weight-only`); `champion` stays on
the floating-point model unless `quantize.may_hold_champion` lets a quantized one win it.

A version's benchmark figures (`<task>/<metric>`, lm-evaluation-harness's) are tags of it; with
`evaluate.benchmark_gate` one of them must not regress for it to take `champion` (`gate.BenchmarkGate`).

Bits per byte compare only on one text: every version names the test split it was measured on
(`test_split`, `corpus_fingerprint`: `test_split.py`), and only versions on the champion's split compete
with it. A version measured on another split neither takes nor loses `champion`: it gets `challenger`
(a quantized one its method's alias), and its tag `not_compared` says why, e.g. "not compared with the
champion (version 3): measured on another test split 1a2b... vs 3c4d...". Versions registered before the
tag existed name no split: they compare with each other only (their split is unknown, not assumed the
same), so a champion among them keeps `champion` until a person moves it. With no champion measured yet,
the newcomer's split decides who competes.

Who holds `champion` is decided by the registry alone (`settle_champion`), so anyone may settle it at any
time: every registration (before and after its own decision), the start of a pipeline run and every
reader of `@champion` (`model_uri`). A registration killed right after a stale set leaves the worse
version `champion` only until the next of them. The alias is the truth: only its holder's `decision` tag
says `champion`, and whoever settles rewrites a claim that no longer holds (a racer's, a champion since
replaced) to what it would have said had it lost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.tracking.models.gate import PASSED, BenchmarkGate
from tasks.tracking.models.test_split import TEST_SPLIT

if TYPE_CHECKING:
    from tasks.params.schema import PipelineParams
    from tasks.tracking.session import TrackingSession

CHAMPION = "champion"
CHALLENGER = "challenger"
# Markdown in MLflow's UI: names in backticks, or `<method>` would be read as an HTML tag and vanish.
DESCRIPTION = (
    "gptpipe models: `@champion` has the best test bits per byte, `@challenger` is the newest that did "
    "not beat it, and `@<method>` (`@bf16`, `@int8-weight-only`, ...) the newest model quantized with that "
    "method."
)


@dataclass(frozen=True)
class Registration:
    registered_model: str
    model_version: str
    model_id: str
    alias: str  # champion, challenger, or a quantized version's method
    test_bits_per_byte: float
    champion_test_bits_per_byte: float | None  # the champion's before this decision (None: there was none)
    benchmark_gate: str | None = None  # the gate's verdict (None: no gate)
    not_compared: str | None = None  # why it was not compared with the champion (None: it was, or none)

    def figures(self) -> dict[str, str | float | None]:
        """What the evaluate stage's figures add of the registration (the keys as the report reads them)."""
        gate = {"benchmark_gate": self.benchmark_gate} if self.benchmark_gate is not None else {}
        refused = {NOT_COMPARED: self.not_compared} if self.not_compared is not None else {}
        return {
            "registered_model": self.registered_model,
            "model_version": self.model_version,
            "alias": self.alias,
            "previous_champion_test_bits_per_byte": self.champion_test_bits_per_byte,
            **gate,
            **refused,
        }


def registered_name(params: PipelineParams) -> str:
    """`tracking.registered_model`, else `gptpipe-iteration-N`, a fine-tune's `gptpipe-iteration-N-<name>`."""
    if params.tracking.registered_model:
        return params.tracking.registered_model
    tune = f"-{params.finetune.name}" if params.finetune is not None else ""
    return f"gptpipe-iteration-{params.iteration}{tune}"


def evaluated_model(
    client: Any, experiment_id: str, run_id: str, checkpoint: Path, digest: str, split: dict[str, str]
) -> Any:
    """The logged model of `checkpoint` (by its sha256), logged now into `run_id` when there is none;
    tagged with the test `split` it was measured on (`test_split.split_tags`), so `models:/<id>` names it."""
    from tasks.tracking.models.logged_models import log_checkpoint_model

    found = client.search_logged_models(
        [experiment_id], filter_string=f"tags.checkpoint_sha256 = '{digest}'", max_results=1
    )
    if found:
        if split:
            client.set_logged_model_tags(found[0].model_id, split)
        return found[0]
    tags = {"stage": "evaluate", **split}
    model_id = log_checkpoint_model(client, experiment_id, run_id, checkpoint, "evaluated", tags)
    return client.get_logged_model(model_id)


def register(
    client: Any,
    experiment_id: str,
    run_id: str,
    name: str,
    checkpoint: Path,
    test_bits_per_byte: float,
    digest: str | None = None,
    lineage: dict[str, str] | None = None,
    benchmarks: dict[str, float] | None = None,
    gate: BenchmarkGate | None = None,
    split: dict[str, str] | None = None,
) -> Registration:
    """Register `checkpoint` (its sha256 `digest`, computed when not given) as a version of `name`; a
    fine-tune's `lineage` (its base model, the adapters' settings) and the `benchmarks` figures
    (`<task>/<metric>`) tag the version; a `gate` the benchmark figure holds back from `champion`; `split`
    (`test_split.split_tags`) names the test split `test_bits_per_byte` was measured on."""
    from gptcore.tools.fingerprint import sha256_file

    digest = digest or sha256_file(checkpoint)
    model = evaluated_model(client, experiment_id, run_id, checkpoint, digest, split or {})
    identity = {"checkpoint_sha256": digest}
    version = _version_of(client, name, identity)
    version = version or _new_version(client, name, model, identity, test_bits_per_byte, lineage=lineage)
    for figure, value in (benchmarks or {}).items():  # also on a version found: scored since, perhaps
        client.set_model_version_tag(name, version.version, figure, str(value))
    verdict = gate.verdict(_settled_champion(client, name)) if gate is not None else None
    if verdict is not None:
        client.set_model_version_tag(name, version.version, "benchmark_gate", verdict)
    may_win = verdict is None or verdict.startswith(PASSED)
    alias, best, refused = _decide(
        client, name, version, test_bits_per_byte, may_win, CHALLENGER, split=split
    )
    return Registration(
        name, str(version.version), model.model_id, alias, test_bits_per_byte, best, verdict, refused
    )


def register_quantized(
    client: Any,
    experiment_id: str,
    run_id: str,
    name: str,
    files: Any,
    digest: str,
    metrics: dict[str, float],
    may_hold_champion: bool = False,
    split: dict[str, str] | None = None,
) -> Registration:
    """Register a quantized model's files (`gptcore.export.model_files.ModelFiles`) of the checkpoint whose
    sha256 is `digest` as a version of `name` tagged `quantization=<method>`, logged first as a logged
    model of `run_id` with its trade-off `metrics` (measured on the test `split`). The alias `<method>`
    moves to it; `champion` only when `may_hold_champion` and its test bits per byte beat the champion's
    on the same split."""
    from tasks.tracking.models.logged_models import log_files_model

    method = files.method
    identity = {"source_checkpoint_sha256": digest, "quantization": method}
    # Measured on the whole test split (it may hold `champion`), or on its first tokens: tagged as such.
    figure = "test_bits_per_byte" if "test_bits_per_byte" in metrics else "prefix_test_bits_per_byte"
    bits = metrics[figure]
    version = _version_of(client, name, identity)
    if version is None:
        tags = {**identity, "stage": "quantize", **(split or {})}
        model_id = log_files_model(client, experiment_id, run_id, files, f"gpt-{method}", tags, metrics)
        version = _new_version(client, name, client.get_logged_model(model_id), identity, bits, figure)
    alias, best, refused = _decide(client, name, version, bits, may_hold_champion, method, figure, split)
    if alias == CHAMPION:
        client.set_registered_model_alias(name, method, version.version)
    model_id = version.tags.get("model_id", "")
    return Registration(name, str(version.version), model_id, alias, bits, best, None, refused)


IMPORTED = "imported"  # the alias of the newest model imported into a registered model


def register_imported(
    client: Any, experiment_id: str, run_id: str, name: str, files: Any, lineage: dict[str, str]
) -> Registration:
    """Register an imported model's files (`hf:...`) as a version of `name` with its `lineage` (source,
    weights sha256), aliased `imported`; importing the same weights again finds their version. It
    competes for `champion` once it is evaluated, not before."""
    from tasks.tracking.models.logged_models import log_files_model

    identity = {"imported_weights_sha256": lineage["weights_sha256"]}
    version = _version_of(client, name, identity)
    if version is None:
        tags = {**identity, **lineage, "stage": "import"}
        model_id = log_files_model(client, experiment_id, run_id, files, "gpt-imported", tags, {})
        version = _new_version(
            client, name, client.get_logged_model(model_id), identity, None, lineage=lineage
        )
    client.set_registered_model_alias(name, IMPORTED, version.version)
    settle_champion(client, name)  # a registration touches the registry: it settles the champion too
    return Registration(
        name, str(version.version), version.tags.get("model_id", ""), IMPORTED, math.nan, None
    )


def _new_version(
    client: Any,
    name: str,
    model: Any,
    identity: dict[str, str],
    bits: float | None,
    figure: str = "test_bits_per_byte",
    lineage: dict[str, str] | None = None,
) -> Any:
    """A new version of `name` (created when missing) for the logged `model`, named on the model too;
    `bits` None: a version measured by nothing yet (an imported model)."""
    from mlflow.exceptions import MlflowException

    try:
        registered = client.get_registered_model(name)
        if registered.description != DESCRIPTION and (registered.description or "").startswith(
            "gptpipe models"
        ):
            client.update_registered_model(name, description=DESCRIPTION)  # an older gptpipe's wording
    except MlflowException:
        try:
            client.create_registered_model(name, description=DESCRIPTION)
        except MlflowException as error:
            if error.error_code != "RESOURCE_ALREADY_EXISTS":
                raise  # else another run (a sweep's trial beside this one) made it meanwhile: use it
    version = client.create_model_version(
        name,
        source=model.artifact_location,
        run_id=model.source_run_id,
        model_id=model.model_id,
        tags={
            **identity,
            "model_id": model.model_id,
            # It competes once its registration decided (`_decide`): one killed before that never does.
            **({figure: str(bits), MAY_HOLD: "false"} if bits is not None else {}),
            **(lineage or {}),
        },
    )
    _link_version(client, model, name, str(version.version))
    return version


def _decide(
    client: Any,
    name: str,
    version: Any,
    bits: float,
    may_win: bool,
    otherwise: str,
    figure: str = "test_bits_per_byte",
    split: dict[str, str] | None = None,
) -> tuple[str, float | None, str | None]:
    """Move `champion` to the best version that may hold it, this one included when `may_win`, else give
    this one the alias `otherwise`; the decision and both figures become its tags, and `split` (the test
    split `bits` was measured on) too. Only versions on the champion's split compete: the third value
    (and the tag `not_compared`) says why this one was not compared with it (None: it was). Safe when
    other processes register at the same moment (two sweep trials, two pipelines, on one store or many
    machines): see `settle_champion`."""
    before = _settled_champion(client, name)  # a stale champion (a racer killed) is no measure
    own = (split or {}).get(TEST_SPLIT, version.tags.get(TEST_SPLIT))
    best = _figure(before) if before is not None and _split(before) == own else None
    for key, value in {**(split or {}), figure: str(bits), MAY_HOLD: str(may_win).lower()}.items():
        client.set_model_version_tag(name, version.version, key, value)  # what it competes with, and where
    champion = settle_champion(client, name, str(version.version))
    wins = champion is not None and str(champion) == str(version.version)
    alias = CHAMPION if wins else otherwise
    if not wins:
        client.set_registered_model_alias(name, alias, version.version)
    refused = None if wins else _not_compared(_champion(client, name), own)
    shown = str(best) if best is not None else ("not compared" if refused else "none")
    told = {"champion_test_bits_per_byte": shown, **({NOT_COMPARED: refused} if refused else {})}
    if not wins:  # a winner's `decision` is the settling's to write (`_record_holder`)
        told[DECISION] = alias
    for key, value in told.items():
        client.set_model_version_tag(name, version.version, key, value)
    if refused is None and NOT_COMPARED in version.tags:  # compared this time: an earlier refusal is stale
        client.delete_model_version_tag(name, version.version, NOT_COMPARED)
    return alias, best, refused


NOT_COMPARED = "not_compared"  # a version's tag: why it was not compared with the champion


def _not_compared(champion: Any, own: str | None) -> str | None:
    """Why a version on test split `own` was not compared with `champion` (None: it was, or none)."""
    if champion is None or _figure(champion) is None or _split(champion) == own:
        return None
    return (
        f"not compared with the champion (version {champion.version}): measured on another test split "
        f"{own or 'unknown (none named)'} vs {_split(champion) or 'unknown (none named)'}"
    )


MAY_HOLD = "may_hold_champion"  # a version's tag: whether it competes for `champion` (quantized: if asked)
DECISION = "decision"  # a version's tag: `champion` on the alias's holder alone, else the alias it got
SETTLE_ROUNDS = 20


def settle_champion(client: Any, name: str, newcomer: str | None = None) -> str | None:
    """Point `champion` at the version with the lowest test bits per byte among those that may hold it
    and were measured on the champion's test split (with no measured champion: the `newcomer`'s, the
    version a registration is deciding, else the newest measured one's), then read back and repeat until
    what is read is what it set. A registration that read the versions before another's better version
    existed (a race) sets a stale alias, and whoever reads after it puts it right, so the last one to
    finish leaves the best; one killed right after a stale set leaves it to the next caller. Idempotent
    and decided by the store alone: anyone may call it at any time, no lock needed. The holder's
    `decision` tag says `champion`, no other version's does. The version it settled on (None: none)."""
    return _version_number(_settle(client, name, newcomer))


def champion_of(session: TrackingSession, name: str) -> str | None:
    """The version `@champion` of `name` names in the session's store, settled first (`settle_champion`)."""
    return settle_champion(session.client, name)


def _settled_champion(client: Any, name: str) -> Any:
    """The champion once settled (a model version; None: none)."""
    return _settle(client, name, None)


def _settle(client: Any, name: str, newcomer: str | None) -> Any:
    for _ in range(SETTLE_ROUNDS):
        versions = client.search_model_versions(f"name = '{name}'")
        current = _champion(client, name)
        best = _best_version(versions, current, _league(current, versions, newcomer))
        if best is not None and not _holds(current, best):
            client.set_registered_model_alias(name, CHAMPION, best.version)
            continue  # read back: another registration may have set its own meanwhile
        if not _record_holder(client, name, versions, current):
            continue
        if _version_number(_champion(client, name)) == _version_number(current):
            return current  # else the alias moved while the tags were written: settle again
    return _champion(client, name)  # contended all along: as it stands


def _holds(current: Any, best: Any) -> bool:
    """Whether the champion `current` may stay: it is the best, or as good (the alias moves for better)."""
    return current is not None and (
        str(current.version) == str(best.version) or _figure(current) == _figure(best)
    )


def _record_holder(client: Any, name: str, versions: list[Any], holder: Any) -> bool:
    """`decision=champion` on `holder` alone: any other version that says it (a racer's claim, a champion
    since replaced) says what it would have had it lost: `challenger`, a quantized one its method. False
    when another settler wrote one of these tags at the same moment (the store refuses the second of two
    first writes of a tag: BAD_REQUEST): read again."""
    from mlflow.exceptions import MlflowException

    number = _version_number(holder)
    told = {
        str(version.version): _lost(version)
        for version in versions
        if version.tags.get(DECISION) == CHAMPION and str(version.version) != number
    }
    if holder is not None and holder.tags.get(DECISION) != CHAMPION:
        told[str(number)] = CHAMPION
    try:
        for version, decision in told.items():
            client.set_model_version_tag(name, version, DECISION, decision)
    except MlflowException as error:
        if error.error_code != "BAD_REQUEST":
            raise
        return False
    return True


def _lost(version: Any) -> str:
    return version.tags.get("quantization", CHALLENGER)


def _version_number(version: Any) -> str | None:
    return str(version.version) if version is not None else None


def _league(champion: Any, versions: list[Any], newcomer: str | None) -> str | None:
    """The test split whose versions compete: a measured champion's, else the `newcomer`'s, else the
    newest measured competitor's (a caller deciding no version: a reader, a run's start)."""
    if champion is not None and _figure(champion) is not None:
        return _split(champion)
    named = [version for version in versions if str(version.version) == newcomer]
    measured = [version for version in versions if _figure(version) is not None and _competes(version)]
    newest = named or sorted(measured, key=lambda version: int(version.version))[-1:]
    return _split(newest[0]) if newest else None


def _best_version(versions: list[Any], champion: Any, split: str | None) -> Any:
    """Among `versions` and the `champion` (read after them: perhaps newer), the competing one on test
    split `split` (None: those naming none) with the lowest test bits per byte (the oldest among equals)."""
    known = {str(version.version) for version in versions}
    newer = [champion] if champion is not None and str(champion.version) not in known else []
    competing = [
        version
        for version in [*versions, *newer]
        if _figure(version) is not None and _competes(version) and _split(version) == split
    ]
    return min(competing, key=lambda v: (_figure(v), int(v.version)), default=None)


def _split(version: Any) -> str | None:
    """The test split a version was measured on; None for one registered before the tag existed."""
    return version.tags.get(TEST_SPLIT) or None


def _competes(version: Any) -> bool:
    """A version's right to `champion`: its tag, else (registered before the tag) not quantized."""
    tags = version.tags
    return tags[MAY_HOLD] == "true" if MAY_HOLD in tags else "quantization" not in tags


def _figure(version: Any) -> float | None:
    try:
        return float(version.tags["test_bits_per_byte"])
    except (KeyError, ValueError):
        return None


def _link_version(client: Any, model: Any, name: str, version: str) -> None:
    """Name the version on the logged model (as `mlflow.register_model` does), so the model pages' column
    *Registered models* shows it."""
    import json

    from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

    known = json.loads(client.get_logged_model(model.model_id).tags.get(MLFLOW_MODEL_VERSIONS, "[]"))
    known.append({"name": name, "version": version})
    client.set_logged_model_tags(model.model_id, {MLFLOW_MODEL_VERSIONS: json.dumps(known)})


def _version_of(client: Any, name: str, identity: dict[str, str]) -> Any:
    """The version of `name` whose tags hold `identity` (a checkpoint's hash, a quantization), or None."""
    terms = " and ".join(f"tags.{key} = '{value}'" for key, value in identity.items())
    found = client.search_model_versions(f"name = '{name}' and {terms}")
    return found[0] if found else None


def _champion(client: Any, name: str) -> Any:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        return None
