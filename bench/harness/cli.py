"""bench/run.sh's scenarios: parse the options, check the tools, start the database, run
each scenario under its time budget, print its summary and where its report is.

    python -m bench.harness SCENARIO [--quick] [--procs N] [--dsn DSN] [--reports DIR]
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness import stack

# How to get what PyPI cannot give (checked before anything starts).
NODE_HINT = "apt-get install -y nodejs   (or: https://nodejs.org, v18 or later)"
PIP_HINT = "pip install -e '.[bench]'"


@dataclass(frozen=True)
class Scenario:
    module: str  # bench.harness.<module>, with run(admin_dsn, args, report, live)
    quick_s: float  # time budget with --quick (the progress bar's total)
    full_s: float
    needs_node: bool = True
    needs_locust: bool = False
    variant: str | None = None  # passed to run() as args.variant


SCENARIOS: dict[str, Scenario] = {
    "throughput": Scenario("throughput", 85, 180, needs_locust=True),
    "slow-destination": Scenario("destinations", 85, 120, variant="slow"),
    "dead-destination": Scenario("destinations", 85, 120, variant="dead"),
    "contention": Scenario("contention", 85, 150, needs_node=False),
    "bloat": Scenario("bloat", 85, 630),
}
ALL = ("contention", "bloat", "throughput", "slow-destination", "dead-destination")
# `all` must end within 20 minutes: its bloat soak is 8 minutes instead of 10.
ALL_BLOAT_S = 480.0


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/run.sh", description="engine benchmark scenarios (bench/README.md)",
    )
    parser.add_argument("scenario", choices=[*SCENARIOS, "all"])
    parser.add_argument("--quick", action="store_true",
                        help="a bounded smoke run of the same scenario (<= 90 s each)")
    parser.add_argument("--procs", type=int, default=2, help="engine delivery workers")
    parser.add_argument("--dsn", help="PostgreSQL server to use (a database is created on"
                        " it and dropped); default: a durable embedded PostgreSQL")
    parser.add_argument("--stock-pg15", action="store_true",
                        help="a throwaway Debian PostgreSQL 15 cluster with stock settings (JIT"
                             " on) instead of the embedded PostgreSQL 18")
    parser.add_argument("--reports", type=Path, default=stack.ROOT / "bench" / "reports",
                        help="folder the report folders go in")
    parser.add_argument("--duration", type=float,
                        help="bloat: soak seconds (default 600, --quick 60)")
    args = parser.parse_args(argv)
    if args.procs < 1:
        parser.error("--procs must be at least 1")
    return args


def missing_tools(names: list[str]) -> list[str]:
    """One line per tool the chosen scenarios need and this machine lacks."""
    problems = []
    scenarios = [SCENARIOS[n] for n in names]
    if any(s.needs_node for s in scenarios) and shutil.which("node") is None:
        problems.append(f"node (Node.js) is not on PATH; install it: {NODE_HINT}")
    modules = ["matplotlib", "rich", "psutil"]
    if any(s.needs_locust for s in scenarios):
        modules.append("locust")
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            problems.append(f"python package {module} is missing; install it: {PIP_HINT}")
    return problems


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    names = list(ALL) if args.scenario == "all" else [args.scenario]
    if args.scenario == "all" and args.duration is None and not args.quick:
        args.duration = ALL_BLOAT_S
    problems = missing_tools(names)
    if problems:
        for line in problems:
            print(f"bench/run.sh: {line}", file=sys.stderr)
        return 2
    # Imported after the check, so a missing package is named, not a traceback.
    import psycopg

    from bench.harness.live import console

    done: list[tuple[str, Path, list[str]]] = []
    name = names[0]
    started = time.monotonic()
    try:
        with stack.server(args.dsn, stock_pg15_cluster=args.stock_pg15) as admin_dsn:
            for name in names:
                folder, headline = run_one(name, admin_dsn, args)
                done.append((name, folder, headline))
    except stack.BenchError as exc:
        console.print(f"[red]bench/run.sh: {exc}[/]")
        return 1
    except (OSError, psycopg.Error) as exc:
        # A part stopped answering (on a badly overloaded machine, or killed): one line.
        console.print(f"[red]bench/run.sh: {name} failed: {type(exc).__name__}: {exc}[/]")
        return 1
    except KeyboardInterrupt:
        console.print("[yellow]bench/run.sh: interrupted; everything it started is stopped[/]")
        return 130
    summary(done, time.monotonic() - started)
    return 0


def run_one(name: str, admin_dsn: str, args: argparse.Namespace) -> tuple[Path, list[str]]:
    from bench.harness.live import live
    from bench.harness.report import Report

    scenario = SCENARIOS[name]
    run: Callable[..., Any] = importlib.import_module(f"bench.harness.{scenario.module}").run
    args.variant = scenario.variant
    options = {"quick": args.quick, "procs": args.procs, "external_dsn": bool(args.dsn),
               "stock_pg15": args.stock_pg15,
               "duration": args.duration}
    report = Report(name, options, args.reports)
    budget = scenario.quick_s if args.quick else scenario.full_s
    began = time.monotonic()
    with live(name, budget) as progress:
        run(admin_dsn, args, report, progress)
    report.data["elapsed_s"] = round(time.monotonic() - began, 1)
    folder = report.save()
    return folder, report.headline


def summary(done: list[tuple[str, Path, list[str]]], elapsed_s: float) -> None:
    from rich.panel import Panel

    from bench.harness.live import console

    for name, folder, headline in done:
        body = "\n".join(f"• {line}" for line in headline)
        rel = folder.relative_to(stack.ROOT) if folder.is_relative_to(stack.ROOT) else folder
        console.print(Panel(f"{body}\n\nreport: {rel}/report.md", title=name, expand=False))
    console.print(f"done in {elapsed_s:.0f} s")
