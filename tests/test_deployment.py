"""The deployments in prefect.yaml, for real: the session's Prefect server on 127.0.0.1, `prefect deploy
--all`, a triggered run picked up by a process worker started once, and the run seen Completed."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from pathlib import Path

import pytest
from process_support import FORKED_PREFECT, forked_process_pool
from test_pipeline import write_corpus, write_params

REPO = Path(__file__).resolve().parent.parent
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def prefect(env: dict[str, str], *args: str, timeout: float = 120) -> str:
    result = subprocess.run(
        [*FORKED_PREFECT, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, (
        f"prefect {' '.join(args)}:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
    )
    return result.stdout


def test_deployed_iteration_1_runs_to_completed_on_a_process_worker(
    tmp_path: Path, prefect_env: dict[str, str]
) -> None:
    env, api = prefect_env, prefect_env["PREFECT_API_URL"]
    template = forked_process_pool(tmp_path)  # the triggered run forked, as the `prefect` commands are
    prefect(
        env,
        "work-pool",
        "create",
        "gptpipe-process",
        "--type",
        "process",
        "--base-job-template",
        str(template),
    )
    deployed = prefect(env, "--no-prompt", "deploy", "--all")
    for name in ("iteration-1-nightly", "iteration-2", "iteration-3", "finetune-docs"):
        assert name in deployed

    write_corpus(tmp_path, documents=12)
    params = write_params(tmp_path)
    triggered = prefect(
        env,
        "deployment",
        "run",
        "end-to-end/iteration-1-nightly",
        "--param",
        f"params_path={params}",
        "--param",
        "until=tokens",
    )
    flow_run_id = UUID.search(triggered.split("UUID", 1)[-1]).group(0)

    prefect(env, "worker", "start", "--pool", "gptpipe-process", "--run-once", timeout=180)

    run = get_json(f"{api}/flow_runs/{flow_run_id}")
    assert run["state"]["type"] == "COMPLETED", run["state"]
    assert any((tmp_path / "data" / "tokens").iterdir())
