"""The CI rules (tests/kit/ci_rules.py and pytest-timeout) on small suites of their own,
each run in a pytest subprocess with its own environment: under CI a skip fails unless it
is an expected needs_jit skip, and a hung test fails with its stack instead of blocking
the run."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SUITE = '''
import pytest

def test_runs():
    pass

def test_skips_for_a_missing_tool():
    pytest.skip("no such tool here")

@pytest.mark.needs_jit
def test_skips_without_jit():
    pytest.skip("this server cannot JIT-compile")
'''

PLUGINS = ("-p", "tests.kit.ci_rules", "-p", "no:cacheprovider")


def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
        *args: str) -> pytest.RunResult:
    for name in ("CI", "ENGINE_REQUIRE_JIT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the plugin is tests.kit.ci_rules
    pytester.makeini("[pytest]\nmarkers =\n    needs_jit: a test that needs JIT\n")
    return pytester.runpytest_subprocess(*PLUGINS, *args, timeout=120)


def test_outside_ci_skips_stay_skips(pytester: pytest.Pytester,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = run(pytester, monkeypatch, {})
    result.assert_outcomes(passed=1, skipped=2)


def test_under_ci_only_the_needs_jit_skip_is_expected(pytester: pytest.Pytester,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = run(pytester, monkeypatch, {"CI": "1"}, "-rfs")
    result.assert_outcomes(passed=1, skipped=1, failed=1)
    result.stdout.fnmatch_lines([
        "*test_skips_for_a_missing_tool*skipped under CI, where every test must run*"])
    assert result.ret != 0


def test_under_ci_with_require_jit_no_skip_is_expected(pytester: pytest.Pytester,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = run(pytester, monkeypatch, {"CI": "1", "ENGINE_REQUIRE_JIT": "1"})
    result.assert_outcomes(passed=1, failed=2)


def test_under_ci_a_module_that_skips_itself_fails(pytester: pytest.Pytester,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_browser='''
import pytest
pytest.skip("chromium is not installed", allow_module_level=True)

def test_page():
    pass
''')
    assert run(pytester, monkeypatch, {}).parseoutcomes() == {"skipped": 1}
    result = run(pytester, monkeypatch, {"CI": "1"})
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*skipped under CI*chromium is not installed*"])


def test_a_hung_test_fails_with_its_stack_and_the_run_goes_on(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_hang='''
import threading

def test_waits_forever():
    threading.Event().wait()

def test_after_it():
    pass
''')
    result = run(pytester, monkeypatch, {}, "-o", "timeout=2")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*def test_waits_forever*", "*threading.Event().wait()*",
                                 "*Failed: Timeout (>2.0s) from pytest-timeout*"])
