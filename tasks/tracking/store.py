"""Where MLflow records go, checked before anything trains, and what never goes there.

The embedded default is a SQLite store, `sqlite:///<cwd>/mlruns/mlflow.db` (MLflow 3.17 no longer
accepts the old `./mlruns` file store). A local store's artifacts go beside its database
(`<database's folder>/artifacts`: `<cwd>/mlruns/artifacts` for the default) unless `tracking.artifact_root`
names a folder: they follow the store, never the working directory of whoever opens it.
`MLFLOW_TRACKING_URI` wins over the parameter file's `tracking.uri`, which wins over the default; any
tracking server works the same way. Every client is built with an explicit URI: nothing here reads or
sets MLflow's process-wide tracking URI or active run, because Prefect runs tasks on worker threads.
"""

from __future__ import annotations

import os
import re
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock

from gptcore.errors import GptpipeError, first_line

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from tasks.params.schema import TrackingConfig

DEFAULT_STORE = "mlruns/mlflow.db"
ARTIFACTS_BESIDE_STORE = "artifacts"  # a local store's artifact root, in its database's folder
PROBE_SECONDS = 5.0
# MLflow's HTTP client retries a refused connection 7 times with backoff factor 2 (minutes) and waits
# 120 s for an answer. The run writer's delivery loop is the one retry layer (it retries, then waits out
# an outage with the records kept), so MLflow's calls fail fast instead: set unless the user set them.
HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}
_SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|AUTH_STRING|CREDENTIAL", re.IGNORECASE)
# Environment worth seeing beside a run (what changes speed or placement); filtered by `redact` anyway.
_ENVIRONMENT = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PREFECT_API_URL", "HOSTNAME")


class TrackingError(GptpipeError):
    """The tracking store cannot be reached or used; raised before any training starts."""

    exit_code = 1


@dataclass(frozen=True)
class TrackingTarget:
    """A resolved tracking location: the URI clients use and, for the embedded store, the artifact root."""

    uri: str
    artifact_location: str | None  # None: the server decides (a remote server's default artifact root)
    source: str  # "MLFLOW_TRACKING_URI", "tracking.uri", "default", or the command flag that chose it

    @property
    def is_local(self) -> bool:
        return self.uri.startswith("sqlite:")

    @property
    def is_http(self) -> bool:
        return self.uri.startswith(("http://", "https://"))

    @property
    def database(self) -> Path | None:
        return Path(self.uri.removeprefix("sqlite:///")) if self.is_local else None


def _local_target(path: str, artifacts: str | None, root: Path, source: str) -> TrackingTarget:
    """A SQLite store and its artifact root: `artifacts` (relative to `root`) when given, else the folder
    beside the database, so a store named by MLFLOW_TRACKING_URI keeps its files with it."""
    database = Path(path)
    database = (database if database.is_absolute() else root / database).resolve()
    artifact_root = database.parent / ARTIFACTS_BESIDE_STORE if artifacts is None else Path(artifacts)
    artifact_root = artifact_root if artifact_root.is_absolute() else root / artifact_root
    return TrackingTarget(f"sqlite:///{database}", artifact_root.resolve().as_uri(), source)


def resolve_target(config: TrackingConfig | None = None, root: Path | None = None) -> TrackingTarget:
    """The tracking location from the environment, else `config`, else the default.

    Relative local paths resolve against `root` (the working directory by default); a local store's
    artifacts are `tracking.artifact_root` when set, else beside its database."""
    artifacts = (config.artifact_root if config is not None else None) or None  # "": not set either
    for source, uri in (
        ("MLFLOW_TRACKING_URI", os.environ.get("MLFLOW_TRACKING_URI")),
        ("tracking.uri", config.uri if config is not None else None),
    ):
        if uri:
            return target_of(uri, source, artifacts, root)
    return target_of(f"sqlite:///{DEFAULT_STORE}", "default", artifacts, root)


def target_of(
    uri: str, source: str, artifacts: str | None = None, root: Path | None = None
) -> TrackingTarget:
    """The tracking location `uri` names (`source` says where it came from, for its error): a command
    that chose its store itself (a replay's) asks here, never through the process's environment."""
    if uri.startswith("sqlite:///"):
        return _local_target(uri.removeprefix("sqlite:///"), artifacts, Path(root or Path.cwd()), source)
    if uri.startswith(("http://", "https://", "databricks", "postgresql", "mysql", "mssql")):
        return TrackingTarget(uri, None, source)
    raise TrackingError(
        f"{source} {redact(uri)!r}: not a store MLflow 3.17 accepts; use sqlite:///PATH/mlflow.db "
        "or http(s)://HOST:PORT of a tracking server (the old ./mlruns file store is refused)"
    )


def _probe_http(uri: str) -> None:
    health = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(health, timeout=PROBE_SECONDS) as response:
            if response.status != 200:
                raise TrackingError(f"tracking server {redact(uri)} answered {response.status} at /health")
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        raise TrackingError(
            f"tracking server {redact(uri)} is unreachable ({reason}); start it (gptpipe ui), fix "
            "MLFLOW_TRACKING_URI / tracking.uri, or unset them to use the local store mlruns/mlflow.db"
        ) from None


def connect(target: TrackingTarget) -> MlflowClient:
    """An `MlflowClient` on `target`, proven usable by one read; a clear TrackingError otherwise."""
    # A progress bar per artifact read (MLflow's default) buries the pipeline's own log lines.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    if target.is_http:
        _probe_http(target.uri)
        for name, value in HTTP_DEFAULTS.items():
            os.environ.setdefault(name, value)
    if target.database is None:
        return _open(target)
    try:
        target.database.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        folder = target.database.parent
        raise TrackingError(f"{folder}: cannot create the tracking store folder ({error})") from None
    # The first open of a SQLite store creates and migrates its tables; two processes doing it at once
    # collide ("duplicate column name"), so processes of this machine open it one at a time.
    lock = FileLock(f"{target.database}.lock")
    try:
        lock.acquire()
    except OSError as error:  # a folder this user may not write
        raise TrackingError(f"{target.database}: cannot open the tracking store ({error})") from None
    try:
        return _open(target)
    finally:
        lock.release()


def _open(target: TrackingTarget) -> MlflowClient:
    from mlflow import MlflowClient

    try:
        client = MlflowClient(tracking_uri=target.uri)
        client.search_experiments(max_results=1)
    except Exception as error:  # MLflow raises many kinds for a store it cannot open
        first = first_line(error)
        raise TrackingError(
            refusal(error, target) or f"tracking store {redact(target.uri)} cannot be used: {redact(first)}"
        ) from None
    return client


def experiment_id_named(target: TrackingTarget, name: str) -> str | None:
    """The id of the experiment `name` in the store, read without checking the store first (a page that
    links to it may be shown before the store is ready); None when there is none or no answer."""
    from mlflow import MlflowClient

    try:
        found = MlflowClient(tracking_uri=target.uri).get_experiment_by_name(name)
    except Exception:  # an unreachable or unreadable store: whoever reads it next says so
        return None
    return found.experiment_id if found is not None else None


def refusal(error: Exception, target: TrackingTarget) -> str | None:
    """One sentence for a tracking server that refused us (HTTP 401 or 403: its basic-auth app), or None.
    The credentials are MLflow's own variables; the password is never named."""
    text = f"{getattr(error, 'error_code', '')} {error}"
    user = os.environ.get("MLFLOW_TRACKING_USERNAME")
    server = f"tracking server {redact(target.uri)}"
    if "error code 401" in text or "UNAUTHENTICATED" in text:
        if user and os.environ.get("MLFLOW_TRACKING_PASSWORD"):
            return f"{server} refused the credentials of user {user!r}: check MLFLOW_TRACKING_PASSWORD"
        return f"{server} asks for credentials: set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"
    if "error code 403" in text or "PERMISSION_DENIED" in text:
        return f"{server} denied user {user!r} this request: ask its admin for permission on the experiment"
    return None


# What MLflow's UI reads to open an experiment as model training (its runs, charts and models) rather
# than as a GenAI application (traces, "agent versions", an assistant panel): the experiment's kind.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


def ensure_experiment(client: MlflowClient, name: str, target: TrackingTarget) -> str:
    """The id of the experiment `name`, created (artifacts under the target's root) when missing, of the
    kind model training (an existing one is given the kind unless it was set on purpose)."""
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.lifecycle_stage == "deleted":
            client.restore_experiment(experiment.experiment_id)
        kind = experiment.tags.get(EXPERIMENT_KIND_TAG, "")
        if kind in ("", "no_inferred_type") or kind.endswith("_inferred"):  # MLflow's guess, or none
            client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return experiment.experiment_id
    location = f"{target.artifact_location}/{name}" if target.artifact_location else None
    try:
        return client.create_experiment(
            name, artifact_location=location, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
        )
    except Exception as error:
        refused = refusal(error, target)
        if refused is not None:
            raise TrackingError(refused) from None
        # Another process created it between our look-up and create: take theirs.
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


# --- what never gets logged ---------------------------------------------------------------------------


def secret_values(environ: dict[str, str] | None = None) -> list[str]:
    """Values of environment variables whose names say TOKEN, KEY, SECRET, PASSWORD, AUTH_STRING or
    CREDENTIAL (long ones first)."""
    environ = os.environ if environ is None else environ
    # By name then .get: another thread (MLflow's telemetry) may remove a variable mid-iteration.
    found = ((name, environ.get(name)) for name in list(environ) if _SECRET_NAME.search(name))
    values = {value for _, value in found if value is not None and len(value) >= 4}
    return sorted(values, key=len, reverse=True)


# A URL's `user:password@` anywhere in a text (an error message names the URL it called): the password
# goes, the user stays so the reader knows which account.
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s/:@]+):[^\s/@]*@")


def redact(value: Any, environ: dict[str, str] | None = None) -> str:
    """`value` as text with every secret environment value and URL password replaced by `***`,
    wherever in the text they stand."""
    text = str(value)
    for secret in secret_values(environ):
        text = text.replace(secret, "***")
    return _URL_PASSWORD.sub(lambda match: f"{match['head']}:***@", text)


def redact_data(value: Any) -> Any:
    """Every string in a JSON-like value redacted (`redact`), its shape kept."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: redact_data(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [redact_data(item) for item in value]
    return value


# The words of a parameter's key that say it holds a secret (`api_key`, `hub_token`), whole words only:
# `max_tokens` and `keep_last` are counts.
_SECRET_WORDS = {"token", "key", "apikey", "secret", "password", "passwd", "credential", "credentials"}


def secret_key(key: str) -> bool:
    """Whether a parameter's key (`tracking.api_key`) says its value is a secret."""
    words = key.rsplit(".", 1)[-1].lower().replace("-", "_").split("_")
    return bool(_SECRET_WORDS.intersection(words)) or "auth_string" in key.lower()


def environment_tags(environ: dict[str, str] | None = None) -> dict[str, str]:
    """A few environment variables as `env.NAME` tags; secret-named ones are never included."""
    environ = os.environ if environ is None else environ
    return {
        f"env.{name}": redact(environ[name], environ)
        for name in _ENVIRONMENT
        if name in environ and not _SECRET_NAME.search(name)
    }


def git_commit(root: Path | None = None) -> str | None:
    """The checked-out commit of the repository holding `root`, or None outside git."""
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=root or Path(__file__).resolve().parent.parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = result.stdout.strip()
    return commit if result.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}", commit) else None
