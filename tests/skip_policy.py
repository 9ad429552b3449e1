"""Which skips CI accepts: a skip the machine explains (no GPU, no PostgreSQL, no network namespaces), and
no other. `make test` installs every extra and `.ci/run` provides Chromium and PostgreSQL, so any other
skip is a test that was meant to run and did not: in CI (CI=true, or GPTPIPE_STRICT_SKIPS=1 anywhere) it
fails the run, one line naming each. Elsewhere, a developer without Chromium (say) still gets a green
run, and a line saying how many skips CI would refuse.

pytest's `-ra` (pyproject.toml's addopts) lists every skip with its reason; this adds the verdict. Under
pytest-xdist the workers' reports reach the controller's hooks, so the verdict is the whole run's."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import pytest

# The skips CI expects, each a category and what its reason says (the reasons are the tests' own:
# tests/test_runtime.py and test_cli_train.py name CUDA or a GPU, test_team_servers.py PostgreSQL,
# test_machines.py the network namespaces and the tools that make them). A new kind of skip that CI
# should accept is a line here, said in its reason.
EXPECTED: dict[str, re.Pattern[str]] = {
    "a GPU or CUDA (present or missing)": re.compile(r"\b(GPU|CUDA)\b"),
    "PostgreSQL (not installed, or refusing root)": re.compile(r"\bPostgreSQL\b"),
    "network namespaces": re.compile(r"network namespace|\biproute2\b"),
}


def strict() -> bool:
    """Whether an unexpected skip fails the run: in CI, or where a person asks for it."""
    return os.environ.get("CI", "").lower() == "true" or os.environ.get("GPTPIPE_STRICT_SKIPS") == "1"


def reason_of(report: pytest.TestReport | pytest.CollectReport) -> str:
    """A skip's reason, as `-ra` shows it (without pytest's `Skipped: `)."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def expected(reason: str) -> bool:
    return any(pattern.search(reason) for pattern in EXPECTED.values())


class SkipPolicy:
    def __init__(self) -> None:
        self.unexpected: list[tuple[str, str]] = []  # (test or module, reason)

    def _seen(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):  # an xfail is reported as a skip too
            reason = reason_of(report)
            if not expected(reason):
                self.unexpected.append((report.nodeid, reason))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._seen(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._seen(report)  # a module skipped whole (a module-level importorskip)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        # Before the terminal's summary (its hook wraps this one), so `pytest`'s exit status says it.
        if self.unexpected and strict() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl(wrapper=True, tryfirst=True)  # around the terminal's own: after its list of skips
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> Iterator[None]:
        yield  # the line that counts the skips follows
        if not self.unexpected:
            return
        accepted = "; ".join(EXPECTED)
        if not strict():
            terminalreporter.write_line(
                f"{len(self.unexpected)} skipped test(s) CI would fail on (it accepts only skips for: "
                f"{accepted}); GPTPIPE_STRICT_SKIPS=1 lists them"
            )
            return
        terminalreporter.section("unexpected skips", sep="=", red=True, bold=True)
        for where, reason in self.unexpected:
            terminalreporter.write_line(f"unexpected skip: {where}: {reason}")
        terminalreporter.write_line(
            f"{len(self.unexpected)} unexpected skip(s) fail this run: CI accepts only skips for {accepted} "
            "(tests/skip_policy.py)",
            red=True,
        )


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) sees every report
        config.pluginmanager.register(SkipPolicy(), "gptpipe-skip-policy")
