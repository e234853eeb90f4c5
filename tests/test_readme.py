"""README.md stays true: its curl examples run, as written, against a running engine, and
.ci/run runs its test command exactly as the README writes it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from tests.kit.enginerun import ROOT, Engine, wait_until

README = (ROOT / "README.md").read_text()
TEST_COMMAND = "bash tools/setup.sh test && pip install -e '.[test]' && python -m pytest -q"
QUICKSTART = ("python3 -m venv .venv && . .venv/bin/activate && bash tools/setup.sh"
              " && pip install -e . && engine demo")


def shell_blocks(text: str) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```", text, flags=re.S | re.M)


def curl_commands(block: str) -> list[str]:
    """Each `curl …` command of a block, its continuation lines joined."""
    commands: list[str] = []
    parts: list[str] = []
    for line in block.splitlines():
        if not parts and not line.startswith("curl "):
            continue  # a comment
        parts.append(line.removesuffix("\\").strip())
        if not line.endswith("\\"):
            commands.append(" ".join(parts))
            parts = []
    return commands


def healthy(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/healthz", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def run_curl_commands(dsn: str, tmp_path: Path, commands: list[str]) -> list[tuple[str, Any]]:
    """Each command as written against a running engine, only pointed at its port and told
    to fail on HTTP errors; the JSON answers in order."""
    assert all("localhost:8080" in c for c in commands)
    with Engine(dsn, tmp_path, "--bind", "127.0.0.1:0", "--procs", "1",
                "--allow-private-targets") as engine:
        started = wait_until(lambda: engine.events("supervisor_started"), 60, "the engine")
        address = started[0]["bind"]
        wait_until(lambda: healthy(f"http://{address}"), 60, "/healthz")
        answers: list[tuple[str, Any]] = []
        for command in commands:
            # As written, only pointed at this test's port and told to fail on HTTP errors.
            line = command.replace("localhost:8080", address) + " --fail-with-body"
            proc = subprocess.run(["bash", "-c", line], capture_output=True, text=True,
                                  timeout=30)
            assert proc.returncode == 0, (command, proc.stdout, proc.stderr)
            if "/metrics" in command:
                assert "engine_" in proc.stdout
            else:
                answers.append((command, json.loads(proc.stdout)))
    return answers


def test_curl_examples_work_against_a_running_engine(dsn: str, tmp_path: Path) -> None:
    commands = curl_commands(shell_blocks(README)[0])
    assert len(commands) >= 10, commands
    answers = run_curl_commands(dsn, tmp_path, commands)
    keyed = [answer for command, answer in answers if "Idempotency-Key: order-42" in command]
    assert len(keyed) == 2 and keyed[0] == keyed[1] and keyed[0]["deliveries"] == 1


def test_tenant_examples_work_against_a_running_engine(dsn: str, tmp_path: Path) -> None:
    block = next(b for b in shell_blocks(README) if "/v1/tenants" in b)
    answers = dict(run_curl_commands(dsn, tmp_path, curl_commands(block)))
    listed_keys = next(a for c, a in answers.items()
                       if c.split()[2].endswith("/acme/keys") and " -d " not in c)
    assert listed_keys["data"][0]["scopes"] == ["send", "read"]
    accepted = next(a for c, a in answers.items() if "/acme/events" in c)
    assert accepted["deliveries"] == 1
    tenants = next(a for c, a in answers.items()
                   if c.split()[2].endswith("/v1/tenants") and " -d " not in c)
    assert [(t["uid"], t["pending"] + t["in_flight"]) for t in tenants["data"]] == [
        ("default", 0), ("acme", 1)]


def test_routing_examples_work_against_a_running_engine(dsn: str, tmp_path: Path) -> None:
    block = next(b for b in shell_blocks(README) if '"filter"' in b)
    answers = run_curl_commands(dsn, tmp_path, curl_commands(block))
    accepted = [a for c, a in answers if "/v1/events" in c]
    assert [a["deliveries"] for a in accepted] == [2, 1]
    patched = answers[-1][1]
    assert patched["filter"] == {"customer.tier": {"$in": ["gold", "platinum"]}}


def test_operator_command_examples_work(dsn: str, tmp_path: Path) -> None:
    block = next(b for b in shell_blocks(README) if b.startswith("engine "))
    commands = [line for line in block.splitlines() if line.startswith("engine ")]
    assert len(commands) >= 10, commands
    (tmp_path / "order.json").write_text('{"id": 43}\n')
    env = {**os.environ, "ENGINE_DSN": dsn, "PYTHONPATH": str(ROOT),
           # `engine` as the console script would run it, from this tree.
           "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    (tmp_path / "engine").write_text(f"#!/bin/sh\nexec {sys.executable} -m engine.cli \"$@\"\n")
    (tmp_path / "engine").chmod(0o755)
    for command in commands:
        proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, (command, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    assert f"\n    {QUICKSTART}\n" in README
    assert f"\n    {TEST_COMMAND}\n" in README
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert TEST_COMMAND in ci
