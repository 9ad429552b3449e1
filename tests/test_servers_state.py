"""`gptpipe servers` trusts nothing in its state folder it did not make: a folder others may write to or
that is not this user's, a secret that is a link, another user's or readable by others, are refused;
files are made exclusively and never through a link; the artifacts are 0700; a module planted in the
folder is never imported by the servers, nor by what they start."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from process_support import reserved_port
from tracking_support import fresh_store

from flows.servers.services import Service, run_services
from flows.servers.team import ServerSettings, Stack, check_state_folder, private_file, secret
from gptcore.errors import ConfigError

AS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not AS_ROOT, reason="making a file another user's needs root")


def other_user() -> pwd.struct_passwd:
    return pwd.getpwnam("nobody")


def test_a_secret_planted_as_a_link_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_text("not a secret")
    (tmp_path / "postgres.password").symlink_to(target)
    with pytest.raises(ConfigError, match=r"postgres.password: a secret that is not a plain file"):
        secret(tmp_path / "postgres.password")
    assert target.read_text() == "not a secret"


def test_a_secret_others_may_read_is_refused_and_a_new_one_is_made_private(tmp_path: Path) -> None:
    loose = tmp_path / "mlflow-admin.password"
    loose.write_text("hunter2")
    loose.chmod(0o644)
    with pytest.raises(
        ConfigError, match=r"mlflow-admin.password: a secret of user \d+ with mode 644; it must"
    ):
        secret(loose)
    made = secret(tmp_path / "new.secret")
    assert made and (tmp_path / "new.secret").stat().st_mode & 0o777 == 0o600


@needs_root
def test_another_users_secret_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "prefect-auth.secret"
    theirs.write_text("hunter2")
    theirs.chmod(0o600)
    os.chown(theirs, other_user().pw_uid, -1)
    with pytest.raises(ConfigError, match=r"prefect-auth.secret: a secret of user \d+ with mode 600"):
        secret(theirs)


def test_a_state_folder_others_may_write_to_is_refused_and_a_new_one_is_private(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match=r"--state shared: owned by user \d+ with mode 777; it must be"):
        check_state_folder(shared, Path("shared"))
    check_state_folder(tmp_path / "fresh", Path("fresh"))
    assert (tmp_path / "fresh").stat().st_mode & 0o777 == 0o700


@needs_root
def test_a_state_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, other_user().pw_uid, -1)
    with pytest.raises(ConfigError, match=r"--state theirs: owned by user"):
        check_state_folder(theirs, Path("theirs"))


def test_the_initdb_password_never_follows_a_planted_link(tmp_path: Path) -> None:
    """It used to be written with the umask's mode, chmod-ed after, through whatever link was there (and,
    as root, chowned to postgres: the link's target with it)."""
    target = tmp_path / "victim"
    target.write_text("keep")
    before = target.stat()
    (tmp_path / "initdb.password").symlink_to(target)
    private_file(tmp_path / "initdb.password", "s3cret", owner="nobody" if AS_ROOT else None)
    made = tmp_path / "initdb.password"
    assert not made.is_symlink() and made.read_text() == "s3cret" and made.stat().st_mode & 0o777 == 0o600
    assert target.read_text() == "keep" and (target.stat().st_uid, target.stat().st_mode) == (
        before.st_uid,
        before.st_mode,
    )


def test_the_servers_import_nothing_from_the_state_folder_and_keep_artifacts_private(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "artifacts").mkdir(mode=0o755)  # as an older gptpipe made it
    stack = Stack(ServerSettings(state=state))
    mlflow, prefect = stack.mlflow(), stack.prefect()
    assert (state / "artifacts").stat().st_mode & 0o777 == 0o700
    for service in (mlflow, prefect):  # in a folder of their own, not the state folder
        assert service.command[1:4] == ["-P", "-m", service.name] and service.cwd == str(state / "work")
    assert (state / "work").stat().st_mode & 0o777 == 0o500 and stack.postgres().cwd == str(
        state / "postgres"
    )
    marker = tmp_path / "imported-from-the-state-folder"
    (state / "mlflow.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    subprocess.run([sys.executable, *mlflow.command[1:3], "mlflow", "--version"], cwd=state, check=True,
                   capture_output=True)  # fmt: skip
    assert not marker.exists()


def test_a_working_folder_planted_as_a_link_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    (state / "work").symlink_to(elsewhere)
    with pytest.raises(
        ConfigError, match=r"state/work: the servers' working folder is a link of user \d+; it must"
    ):
        Stack(ServerSettings(state=state)).mlflow()
    assert elsewhere.stat().st_mode & 0o777 == 0o755


def test_anything_in_the_working_folder_is_refused_before_a_server_starts(tmp_path: Path) -> None:
    """Uvicorn puts the folder it runs in on the import path itself (its --app-dir), whatever Python is
    told: that folder must hold nothing."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "work").mkdir(mode=0o700)
    (state / "work" / "uvicorn.py").write_text("")
    with pytest.raises(
        ConfigError, match=r"state/work: the servers' working folder holds uvicorn.py; it must be empty"
    ):
        Stack(ServerSettings(state=state)).prefect()


# What a planted module does when imported: leaves its mark, and ends the process at once (no server).
PLANTED = "import os, pathlib\npathlib.Path({mark!r}).touch()\nos._exit(3)\n"
MODULES = ("uvicorn", "mlflow", "fastapi", "starlette")  # what `mlflow server` and its uvicorn import


class Answered(Exception):
    """The service answered its readiness check: stop it."""


def start_until_it_answers(service: Service, when_ready: Callable[[], None]) -> str:
    """`service` started as `gptpipe servers` starts it, `when_ready` called once it answers, then stopped:
    "answered", or why it did not answer."""

    def answered() -> None:
        when_ready()
        raise Answered

    try:
        run_services([[service]], lambda name, line: None, answered)
    except Answered:
        return "answered"
    except ConfigError as error:
        return str(error)
    return "stopped"


@pytest.fixture
def port() -> Iterator[int]:
    """A port held for the test's server (`process_support.reserved_port`)."""
    with reserved_port() as held:
        yield held


def test_a_module_planted_in_the_state_folder_never_runs_in_what_the_servers_start(
    tmp_path: Path, port: int
) -> None:
    """`mlflow server` starts `python -m uvicorn` itself, without `-P`, and uvicorn imports from the folder
    it runs in: were that the state folder, a `uvicorn.py` there would be the server. Every process of a
    service runs in the empty working folder, with PYTHONSAFEPATH set."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    stack = Stack(ServerSettings(state=state, mlflow_port=port, mlflow_workers=1))
    mlflow = stack.mlflow()
    assert mlflow.env is not None
    mlflow.env["MLFLOW_BACKEND_STORE_URI"] = fresh_store(tmp_path)  # SQLite for PostgreSQL: the same start
    marks = tmp_path / "marks"
    marks.mkdir()
    for module in MODULES:
        (state / f"{module}.py").write_text(PLANTED.format(mark=str(marks / module)))
    seen: dict[str, tuple[str, str | None]] = {}

    def look() -> None:  # every process of the service, while it answers
        top = psutil.Process(mlflow.tree.process.pid)
        for member in (top, *top.children(recursive=True)):
            seen[" ".join(member.cmdline()[1:4])] = (member.cwd(), member.environ().get("PYTHONSAFEPATH"))

    outcome = start_until_it_answers(mlflow, look)
    assert sorted(path.name for path in marks.iterdir()) == []
    assert outcome == "answered"
    assert any("uvicorn" in command for command in seen), seen  # the server's own child among them
    assert set(seen.values()) == {(str(state / "work"), "1")}, seen
    assert list((state / "work").iterdir()) == []  # nothing wrote there: the next start takes it
