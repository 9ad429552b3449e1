"""A team's servers on one machine: MLflow's tracking server and Prefect's server, both on PostgreSQL.

`gptpipe servers` runs what `deploy/README.md` lists as plain commands, and stops all of it together:
a PostgreSQL cluster under the state folder (made on the first start, with a generated password) holding
the databases `mlflow`, `mlflow_auth` and `prefect`; `mlflow server` on it with artifacts proxied by the
server (`--artifacts-destination`: clients need no access to the storage); `prefect server start` on it.
With `auth`, MLflow's basic-auth app (an admin whose password is generated; the users live in PostgreSQL
too) and Prefect's API auth string. PostgreSQL listens on loopback only (only the two servers use it);
the servers bind loopback unless told otherwise. Every secret is a file of mode 0600 under the state
folder; `client.env` there holds what a client exports. None is printed.

The state folder is trusted only when it is this user's and nobody else may write to it; a secret only
when it is a plain file of this user's that nobody else may read. Files are made exclusively, never
through a link, 0600 from their first byte; the artifacts folder is 0700 (MLflow's auth guards them,
not the file system). No service runs in the state folder: MLflow and Prefect start in `work/`, an empty
folder of mode 0500 that nothing writes (uvicorn imports the app from where it runs, whatever Python is
told), PostgreSQL in its cluster folder; and Python imports nothing from the folder it runs in (`-P`, and
PYTHONSAFEPATH for what the servers start in turn: MLflow's server starts `python -m uvicorn` itself).
"""

from __future__ import annotations

import contextlib
import glob
import ipaddress
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from flows.servers.services import Service, run_services
from gptcore.errors import ConfigError

DATABASES = ("mlflow", "mlflow_auth", "prefect")
ROLE = "gptpipe"  # the PostgreSQL role both servers connect as
ADMIN = "admin"  # the MLflow basic-auth admin, and the Prefect auth string's user part
JOB_EXECUTION = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"
AUTH_CACHE_SECONDS = 60


def server_environment(jobs: bool = False) -> dict[str, str]:
    """An MLflow server's environment. Its job runner (eight more processes that run MLflow's GenAI jobs:
    LLM judges, prompt optimization) serves nothing gptpipe records and slows the start-up (11.7 s
    against 7.3 s to answer on 2 cores): off unless asked for (`--jobs`) or set in the environment."""
    env = dict(os.environ)
    if jobs:
        env[JOB_EXECUTION] = "true"
    env.setdefault(JOB_EXECUTION, "false")
    return env


@dataclass(frozen=True)
class ServerSettings:
    """What `gptpipe servers` was asked for."""

    state: Path  # the cluster, the artifacts, the secrets
    host: str = "127.0.0.1"  # where MLflow and Prefect listen
    mlflow_port: int = 5000
    prefect_port: int = 4200
    postgres_port: int = 5432
    auth: bool = False
    mlflow_workers: int = 2
    allowed_hosts: str | None = None  # MLflow's Host-header check (default: localhost and private IPs)

    @property
    def wildcard(self) -> bool:
        try:
            return ipaddress.ip_address(self.host).is_unspecified
        except ValueError:
            return False

    @property
    def reach(self) -> str:
        """The host name clients use: the bound address, or this machine's name for a wildcard one."""
        host = socket.gethostname() if self.wildcard else self.host
        return f"[{host}]" if ":" in host else host

    @property
    def local(self) -> str:
        """Where this machine's own readiness checks reach the servers."""
        return "127.0.0.1" if self.wildcard else self.reach


def secret(path: Path, make: str | None = None) -> str:
    """The secret in `path`, made (mode 0600, before anything is written into it) when missing; one that
    is a link, another user's, or readable by others is refused."""
    if not path.exists() and not path.is_symlink():
        private_file(path, make or secrets.token_urlsafe(24))
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as error:
        raise ConfigError(
            f"{path}: a secret that is not a plain file ({error.strerror}); remove it"
        ) from None
    with os.fdopen(descriptor) as handle:
        info = os.fstat(handle.fileno())
        if info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise ConfigError(
                f"{path}: a secret of user {info.st_uid} with mode {info.st_mode & 0o777:o}; it must be this "
                f"user's ({os.geteuid()}) and 0600: remove it to have a new one made"
            )
        return handle.read().strip()


def private_file(path: Path, text: str, owner: str | None = None) -> None:
    """`text` in a new file made 0600 from its first byte, never through a link (a stale file or link
    in its place is removed first), handed to `owner` through the open file, not by name."""
    path.unlink(missing_ok=True)  # a link planted here goes, its target untouched
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        if owner is not None:
            entry = pwd.getpwnam(owner)
            os.fchown(handle.fileno(), entry.pw_uid, entry.pw_gid)
        handle.write(text)


def check_state_folder(state: Path, shown: Path, traversable: bool = False) -> None:
    """A state folder this user owns and nobody else may write to (else a planted file would be a
    secret, a cluster, or code the servers run); made 0700 when missing (0711 when PostgreSQL runs as
    another user, who must pass through it to its cluster)."""
    try:
        state.mkdir(mode=0o711 if traversable else 0o700, parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"--state {shown}: cannot make the folder ({error})") from None
    info = state.lstat()
    if state.is_symlink() or not state.is_dir():
        raise ConfigError(f"--state {shown}: not a folder of its own (a link or a file)")
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise ConfigError(
            f"--state {shown}: owned by user {info.st_uid} with mode {info.st_mode & 0o777:o}; it must be "
            f"this user's ({os.geteuid()}) and writable by nobody else (chmod go-w)"
        )


def working_folder(path: Path) -> Path:
    """`path` as the servers' working folder: this user's, empty, 0500 (made so when missing), so nothing
    writes into it, the servers included. Uvicorn imports the app from the folder it runs in whatever
    Python is told; a link, a file or another user's folder in its place, or anything in it, is refused."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o500)
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        mode = info.st_mode
        kind = "a link" if stat.S_ISLNK(mode) else "a folder" if stat.S_ISDIR(mode) else "a file"
        raise ConfigError(
            f"{path}: the servers' working folder is {kind} of user {info.st_uid}; it must be a folder of "
            f"this user's ({os.geteuid()}): remove it to have a new one made"
        )
    path.chmod(0o500)
    held = sorted(os.listdir(path))
    if held:
        shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
        raise ConfigError(
            f"{path}: the servers' working folder holds {shown}; it must be empty (the servers' uvicorn "
            "imports from it): remove them"
        )
    return path


def postgres_program(name: str) -> str:
    """A PostgreSQL server program: on PATH, else Debian's /usr/lib/postgresql/N/bin (newest N)."""
    debian = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda path: int(path.split("/")[4]))
    found = shutil.which(name) or (debian[-1] if debian else None)
    if found is None:
        raise ConfigError(
            f"PostgreSQL's {name} was not found on PATH or in /usr/lib/postgresql/N/bin: install Debian's "
            "postgresql package (apt-get install postgresql), or use containers (deploy/compose.yaml)"
        )
    return found


def postgres_user() -> str | None:
    """Who runs PostgreSQL: this user, or when that is root (which PostgreSQL refuses) the user named by
    GPTPIPE_POSTGRES_USER, else `postgres`, else `nobody`."""
    if os.geteuid() != 0:
        return None
    for name in (os.environ.get("GPTPIPE_POSTGRES_USER"), "postgres", "nobody"):
        if name:
            try:
                pwd.getpwnam(name)
                return name
            except KeyError:
                continue
    raise ConfigError("PostgreSQL refuses to run as root and no other user exists: set GPTPIPE_POSTGRES_USER")


class Stack:
    """The three services of `gptpipe servers` and the files under the state folder."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.state = settings.state.resolve()
        self.cluster = self.state / "postgres"
        self.artifacts = self.state / "artifacts"
        self.work = self.state / "work"  # where MLflow and Prefect run: empty, written by nobody
        self.user = postgres_user()

    # --- PostgreSQL -----------------------------------------------------------------------------------

    def database_url(self, database: str, driver: str = "postgresql+psycopg") -> str:
        password = secret(self.state / "postgres.password")
        return f"{driver}://{ROLE}:{password}@127.0.0.1:{self.settings.postgres_port}/{database}"

    def init_cluster(self) -> None:
        """`initdb` on the first start: password authentication, the role `gptpipe`, UTF-8."""
        check_state_folder(self.state, self.settings.state, traversable=self.user is not None)
        if (self.cluster / "PG_VERSION").exists():
            return
        password = secret(self.state / "postgres.password")
        self.cluster.mkdir(mode=0o700, exist_ok=True)
        self._own(self.cluster)
        self._check_reachable()
        initial = self.state / "initdb.password"  # initdb reads it as the PostgreSQL user; gone after
        private_file(initial, password, owner=self.user)
        try:
            command = [postgres_program("initdb"), "-D", str(self.cluster), "-U", ROLE]
            command += ["--pwfile", str(initial), "--auth=scram-sha-256", "-E", "UTF8", "--no-instructions"]
            result = subprocess.run(
                command, capture_output=True, text=True, user=self.user, cwd=self.cluster, check=False
            )
        finally:
            initial.unlink(missing_ok=True)
        if result.returncode != 0:
            shutil.rmtree(self.cluster, ignore_errors=True)  # a half-made cluster would stop the next start
            last = (result.stderr or result.stdout).strip().splitlines()[-1:]
            reason = " ".join(last) or f"status {result.returncode}"
            raise ConfigError(f"initdb {self.cluster} failed: {reason}")

    def _own(self, path: Path) -> None:
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def _check_reachable(self) -> None:
        """PostgreSQL runs as another user when we are root: every folder above the cluster must let
        that user through, or initdb fails with a message about permissions far from the cause."""
        if self.user is None:
            return
        probe = subprocess.run(["test", "-w", str(self.cluster)], user=self.user, check=False)
        if probe.returncode != 0:
            raise ConfigError(
                f"--state {self.settings.state}: PostgreSQL runs as user {self.user} (it refuses root), who "
                f"cannot reach {self.cluster}: use a folder every user can traverse (chmod o+x on its "
                "parents) or set GPTPIPE_POSTGRES_USER"
            )

    def postgres(self) -> Service:
        command = [postgres_program("postgres"), "-D", str(self.cluster)]
        command += ["-p", str(self.settings.postgres_port)]
        command += ["-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="]
        command += ["-c", "max_connections=200"]  # two servers' pools and many writers' requests
        return Service(
            "postgres", command, self._postgres_answers,
            cwd=str(self.cluster),  # its user's folder, where it runs anyway; it must reach it as that user
            user=self.user, prepare=self._create_databases,
            death_signal=signal.SIGINT,  # "fast" shutdown: it does not wait for clients that are gone too
        )  # fmt: skip

    def _connect(self):
        import psycopg

        password = secret(self.state / "postgres.password")
        return psycopg.connect(
            host="127.0.0.1", port=self.settings.postgres_port, user=ROLE, password=password,
            dbname="postgres", connect_timeout=2,
            autocommit=True,  # CREATE DATABASE cannot run inside a transaction
        )  # fmt: skip

    def _postgres_answers(self) -> bool:
        import psycopg

        try:
            self._connect().close()
            return True
        except psycopg.OperationalError:
            return False

    def _create_databases(self) -> None:
        connection = self._connect()
        try:
            with connection.cursor() as cursor:
                for database in DATABASES:
                    cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
                    if cursor.fetchone() is None:
                        cursor.execute(f'CREATE DATABASE "{database}"')
        finally:
            connection.close()

    # --- the servers ----------------------------------------------------------------------------------

    def mlflow(self) -> Service:
        s = self.settings
        self.artifacts.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.artifacts.chmod(0o700)  # one an older gptpipe made 0755: every local user read every model
        command = [
            sys.executable,
            "-P",
            "-m",
            "mlflow",
            "server",
            "--host",
            s.host,
            "--port",
            str(s.mlflow_port),
        ]
        command += ["--workers", str(s.mlflow_workers), "--artifacts-destination", self.artifacts.as_uri()]
        if s.allowed_hosts:
            command += ["--allowed-hosts", s.allowed_hosts]
        env = server_environment()
        env["MLFLOW_BACKEND_STORE_URI"] = self.database_url("mlflow")  # the environment, not ps's view
        if s.auth:
            command += ["--app-name", "basic-auth"]
            env.update(self._mlflow_auth())
        health = f"http://{s.local}:{s.mlflow_port}/health"
        return Service("mlflow", command, lambda: _answers(health), str(working_folder(self.work)), env=env)

    def _mlflow_auth(self) -> dict[str, str]:
        config = self.state / "mlflow-auth.ini"
        config.unlink(missing_ok=True)
        text = "[mlflow]\ndefault_permission = READ\n"
        text += f"database_uri = {self.database_url('mlflow_auth')}\nadmin_username = {ADMIN}\n"
        text += "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        # Each request's password check is a PBKDF2 hash: with many writers logging every step it is most
        # of the server's work. Cached for a minute per worker (a changed password applies within it).
        text += f"auth_cache_ttl_seconds = {AUTH_CACHE_SECONDS}\n"
        secret(config, make=text)  # it holds the database password: 0600 like the others
        return {
            "MLFLOW_AUTH_CONFIG_PATH": str(config),
            "MLFLOW_AUTH_ADMIN_PASSWORD": self.mlflow_password,
            "MLFLOW_FLASK_SERVER_SECRET_KEY": secret(self.state / "mlflow-flask.secret"),
        }

    @property
    def mlflow_password(self) -> str:
        return secret(self.state / "mlflow-admin.password")

    @property
    def prefect_auth_string(self) -> str:
        return f"{ADMIN}:{secret(self.state / 'prefect-auth.secret')}"

    def prefect(self) -> Service:
        s = self.settings
        command = [sys.executable, "-P", "-m", "prefect", "server", "start"]
        command += ["--host", s.host, "--port", str(s.prefect_port)]
        client_side = ("PREFECT_API_URL", "PREFECT_API_AUTH_STRING", "PREFECT_API_KEY")  # a client's
        env = {name: value for name, value in os.environ.items() if name not in client_side}
        env["PREFECT_HOME"] = str(self.state / "prefect")
        env.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # no calls home unless the team asks
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = self.database_url("prefect", "postgresql+asyncpg")
        if s.auth:
            env["PREFECT_SERVER_API_AUTH_STRING"] = self.prefect_auth_string
        health = f"http://{s.local}:{s.prefect_port}/api/health"
        return Service("prefect", command, lambda: _answers(health), str(working_folder(self.work)), env=env)

    # --- what clients use -----------------------------------------------------------------------------

    def client_environment(self) -> dict[str, str]:
        s = self.settings
        env = {
            "MLFLOW_TRACKING_URI": f"http://{s.reach}:{s.mlflow_port}",
            "PREFECT_API_URL": f"http://{s.reach}:{s.prefect_port}/api",
        }
        if s.auth:
            env["MLFLOW_TRACKING_USERNAME"] = ADMIN
            env["MLFLOW_TRACKING_PASSWORD"] = self.mlflow_password
            env["PREFECT_API_AUTH_STRING"] = self.prefect_auth_string
        return env

    def write_client_env(self) -> Path:
        path = self.state / "client.env"
        path.unlink(missing_ok=True)
        secret(path, make="".join(f"{name}={value}\n" for name, value in self.client_environment().items()))
        return path

    def run(self, on_line, on_ready) -> None:
        self.init_cluster()
        groups = [[self.postgres()], [self.mlflow(), self.prefect()]]
        run_services(groups, on_line, on_ready)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False
