"""`gptpipe servers` trusts nothing in its state folder it did not make: a folder others may write to or
that is not this user's, a secret that is a link, another user's or readable by others, are refused;
files are made exclusively and never through a link; the artifacts are 0700; a module planted in the
folder is never imported by the servers."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

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
    for service in (mlflow, prefect):
        assert service.command[1:4] == ["-P", "-m", service.name] and service.cwd == str(state)
    marker = tmp_path / "imported-from-the-state-folder"
    (state / "mlflow.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    subprocess.run([sys.executable, *mlflow.command[1:3], "mlflow", "--version"], cwd=state, check=True,
                   capture_output=True)  # fmt: skip
    assert not marker.exists()
