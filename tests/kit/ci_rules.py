"""Under CI (.ci/run exports CI=1) a test that skips fails instead: a missing tool or
privilege must not pass as green. The one expected skip is a `needs_jit` test on a server
without JIT (the embedded PostgreSQL 18), and not even that when ENGINE_REQUIRE_JIT=1
(.ci/run's PostgreSQL 15 run, whose server has JIT). A pytest plugin, loaded by
tests/conftest.py; tests/test_ci_rules.py runs it on small suites of its own."""

from __future__ import annotations

import os

import pytest

UNDER_CI = bool(os.environ.get("CI"))
REQUIRE_JIT = os.environ.get("ENGINE_REQUIRE_JIT") == "1"


def skip_is_expected(item: pytest.Item) -> bool:
    return item.get_closest_marker("needs_jit") is not None and not REQUIRE_JIT


def _reason(longrepr: object) -> object:
    return longrepr[2] if isinstance(longrepr, tuple) else longrepr


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if UNDER_CI and report.skipped and not skip_is_expected(item):
        report.outcome = "failed"
        report.longrepr = (f"skipped under CI, where every test must run: "
                           f"{_reason(report.longrepr)}\n"
                           "(install what it names: bash tools/setup.sh test)")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):  # type: ignore[no-untyped-def]
    """A module that skips itself at import (pytest.skip(allow_module_level=True)) fails
    under CI as a skipped test does."""
    outcome = yield
    report = outcome.get_result()
    if UNDER_CI and report.skipped:
        report.outcome = "failed"
        report.longrepr = (f"{collector.nodeid} skipped under CI, where every test must "
                           f"run: {_reason(report.longrepr)}")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if UNDER_CI:
        skipped = len(terminalreporter.stats.get("skipped", []))
        terminalreporter.write_line(
            f"CI: {skipped} expected skip(s) (needs_jit on a server without JIT), "
            "any other skip failed its test")
