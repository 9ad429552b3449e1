"""The glibc malloc tuning `gptpipe` applies before torch loads: when it applies, and what it reports."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

from gptcore.runtime import malloc as host_memory

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GLIBC_TUNABLES", "GPTPIPE_MALLOC_TUNING", *host_memory._USER_SETTINGS):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_tuning_applies_here_and_is_exported_for_child_processes() -> None:
    assert host_memory._tune() == host_memory.TUNED
    assert os.environ["GLIBC_TUNABLES"] == host_memory.TUNABLES


def test_the_users_own_settings_and_the_opt_out_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1048576")
    assert host_memory._tune().startswith("user settings")
    monkeypatch.setenv("GPTPIPE_MALLOC_TUNING", "0")
    assert host_memory._tune() == "default (GPTPIPE_MALLOC_TUNING=0)"


def test_a_child_process_reports_the_settings_it_inherited(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLIBC_TUNABLES", host_memory.TUNABLES)
    monkeypatch.setattr(host_memory, "_state", None)  # tune_malloc never ran here
    assert host_memory.describe() == f"{host_memory.TUNED} (inherited)"


def test_the_nightly_cpu_deployment_starts_its_flow_runs_with_the_same_settings() -> None:
    deployments = yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]
    nightly = next(d for d in deployments if d["name"] == "iteration-1-nightly")
    assert nightly["work_pool"]["job_variables"]["env"]["GLIBC_TUNABLES"] == host_memory.TUNABLES
