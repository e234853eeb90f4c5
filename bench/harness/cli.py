"""`python -m bench SCENARIO [options]` (bench/run.sh is the same): the one registry of
scenarios, and the runner of the timed ones.

A timed scenario takes the shared options (--quick, --procs, --dsn, --stock-pg15,
--reports, --duration): the runner checks the tools it needs, starts the database, runs
it under its time budget with a live progress bar, prints its summary and where its report
folder is. A scenario with its own options (the drains, peers, ingress, the CI gate) is
handed the rest of the command line; `python -m bench SCENARIO --help` shows them.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness import stack
from bench.harness.report import REPORTS

# How to get what PyPI cannot give (checked before anything starts).
NODE_HINT = "apt-get install -y nodejs   (or: https://nodejs.org, v18 or later)"
PIP_HINT = "pip install -e '.[bench]'"


@dataclass(frozen=True)
class Timed:
    """Run here: bench.harness.<module>.run(admin_dsn, args, report, live)."""

    summary: str
    module: str
    quick_s: float  # time budget with --quick (the progress bar's total)
    full_s: float
    needs_node: bool = True
    needs_locust: bool = False
    variant: str | None = None  # passed to run() as args.variant


@dataclass(frozen=True)
class Suite:
    """Several timed scenarios in turn, on one database server."""

    summary: str
    members: tuple[str, ...]


@dataclass(frozen=True)
class OwnOptions:
    """bench.harness.<module>.main(argv) with `argv_prefix` before the user's arguments."""

    summary: str
    module: str
    argv_prefix: tuple[str, ...] = ()


Scenario = Timed | Suite | OwnOptions

SCENARIOS: dict[str, Scenario] = {
    "throughput": Timed("ingest and delivery together at fixed offered rates (locust)",
                        "throughput", 85, 180, needs_locust=True),
    "slow-destination": Timed("healthy throughput beside slow endpoints", "destinations",
                              85, 120, variant="slow"),
    "dead-destination": Timed("healthy throughput beside dead endpoints", "destinations",
                              85, 120, variant="dead"),
    "contention": Timed("claimers x claim size on one backlog, the claim path alone",
                        "contention", 85, 150, needs_node=False),
    "bloat": Timed("dead tuples, sizes, vacuum and claim latency in a soak, with advice",
                   "bloat", 85, 630),
    "all": Suite("the five timed scenarios in turn, under 20 minutes",
                 ("contention", "bloat", "throughput", "slow-destination",
                  "dead-destination")),
    "drain-fast": OwnOptions("a backlog of 20,000 drained to a destination answering at once",
                             "drain", ("drain-fast",)),
    "drain-slow": OwnOptions("a backlog of 10,000 drained to a destination answering in 100 ms",
                             "drain", ("drain-slow",)),
    "many-destinations": OwnOptions("20,000 drained over 1,000 destinations, half capped",
                                    "drain", ("many-destinations",)),
    "capped-slow": OwnOptions("10,000 drained over 100 destinations capped at 5, 100 ms each",
                              "drain", ("capped-slow",)),
    "peers": OwnOptions("the drains in pairs against pgqueuer (python bench/peers.py)",
                        "peers"),
    "ingress": OwnOptions("accept latency and ceilings against pgbench (locust and wrk)",
                          "ingress"),
    "ingest-ceiling": OwnOptions(
        "single-event and batch ingest against pgbench's single-row INSERT, in one run",
        "ingest_ceiling"),
    "event-schema-cost": OwnOptions(
        "ingress CPU per 1 KB event with a 20-property JSON Schema against none",
        "event_schema_cost"),
    "tenant-migration": OwnOptions(
        "tenants' migrations on 1,000,000 finished deliveries under the engine before them",
        "tenant_migration"),
    "partition-migration": OwnOptions(
        "partitioned history's migrations on 1,000,000 finished deliveries under a live engine",
        "partition_migration"),
    "noisy-neighbour": OwnOptions(
        "tenant B's latency at 20 events/s while tenant A drains 200,000 (and A alone)",
        "noisy_neighbour"),
    "tenants-10k": OwnOptions(
        "100,000 drained over 10,000 tenants x 3 destinations against one tenant's 30,000",
        "tenants_scale"),
    "claim-cost": OwnOptions(
        "the cost of one claim: one tenant, two, 10,000 (A/B: --engine-tree)", "claim_cost"),
    "filter-fanout": OwnOptions(
        "CPU per event of a 1 KB event to 1,000 destinations with 5-condition filters vs none",
        "filter_fanout"),
    "tracing-cost": OwnOptions(
        "drain-fast's CPU per delivery with OpenTelemetry spans exported against none",
        "tracing_cost"),
    "mtls-drain": OwnOptions(
        "a backlog drained over mutual TLS against the same over plain TLS (issue 42: >= 80 %)",
        "mtls_drain"),
    "gate": OwnOptions("CI's gate: a small drain's CPU per delivery against bench/baseline.json",
                       "gate"),
}
# `all` must end within 20 minutes: its bloat soak is 8 minutes instead of 10.
ALL_BLOAT_S = 480.0


DEFAULT_SCENARIO = "throughput"


def usage() -> str:
    width = max(map(len, SCENARIOS))
    lines = [f"  {name:<{width}}  {scenario.summary}" for name, scenario in SCENARIOS.items()]
    return ("usage: python -m bench [SCENARIO] [options]   (or bench/run.sh [SCENARIO] ...;"
            f" without one, {DEFAULT_SCENARIO})\n\n"
            "scenarios (bench/README.md says what each measures and how to read its report;"
            "\n`python -m bench SCENARIO --help` lists its options):\n" + "\n".join(lines))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(usage())
        return 0
    # SPEC: `bench/run.sh [scenario] [--quick] ...`; without a scenario, throughput.
    if not args or args[0].startswith("-"):
        args = [DEFAULT_SCENARIO, *args]
    name, rest = args[0], args[1:]
    scenario = SCENARIOS.get(name)
    if scenario is None:
        print(f"bench: unknown scenario '{name}'\n\n{usage()}", file=sys.stderr)
        return 2
    if isinstance(scenario, OwnOptions):
        entry: Callable[[list[str]], int] = importlib.import_module(
            f"bench.harness.{scenario.module}").main
        return entry([*scenario.argv_prefix, *rest])
    members = list(scenario.members) if isinstance(scenario, Suite) else [name]
    return run_timed(name, members, rest)


def parse_timed(name: str, argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=f"python -m bench {name}", description=SCENARIOS[name].summary)
    parser.add_argument("--quick", action="store_true",
                        help="a bounded smoke run of the same scenario (<= 90 s each)")
    parser.add_argument("--procs", type=int, default=2, help="engine delivery workers")
    stack.add_server_arguments(parser)
    parser.add_argument("--reports", type=Path, default=REPORTS,
                        help="folder the report folders go in")
    parser.add_argument("--duration", type=float,
                        help="bloat: soak seconds (default 600, --quick 60)")
    parser.add_argument("--history", choices=("partitions", "deletes", "both"),
                        help="bloat: history passing retention on a compressed clock, removed "
                             "by dropping day partitions (this checkout) or by the batch "
                             "deletes of the engine before partitions; both: side by side "
                             "(bench/harness/bloat_history.py)")
    parser.add_argument("--history-day-s", type=float,
                        help="bloat --history: seconds per day of the compressed clock "
                             "(default 30, --quick 10)")
    args = parser.parse_args(argv)
    if args.procs < 1:
        parser.error("--procs must be at least 1")
    return args


def missing_tools(scenarios: Sequence[Timed]) -> list[str]:
    """One line per tool the chosen scenarios need and this machine lacks."""
    problems = []
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


def timed(name: str) -> Timed:
    scenario = SCENARIOS[name]
    assert isinstance(scenario, Timed), name
    return scenario


def run_timed(name: str, members: list[str], argv: Sequence[str]) -> int:
    args = parse_timed(name, argv)
    if name == "all" and args.duration is None and not args.quick:
        args.duration = ALL_BLOAT_S
    problems = missing_tools([timed(n) for n in members])
    if problems:
        for line in problems:
            print(f"bench: {line}", file=sys.stderr)
        return 2
    # Imported after the check, so a missing package is named, not a traceback.
    import psycopg

    from bench.harness.live import console

    done: list[tuple[str, Path, list[str]]] = []
    current = members[0]
    started = time.monotonic()
    try:
        with stack.server(args.dsn, stock_pg15_cluster=args.stock_pg15) as admin_dsn:
            for current in members:
                folder, headline = run_one(current, admin_dsn, args)
                done.append((current, folder, headline))
    except stack.BenchError as exc:
        console.print(f"[red]bench: {exc}[/]")
        return 1
    except (OSError, psycopg.Error) as exc:
        # A part stopped answering (on a badly overloaded machine, or killed): one line.
        console.print(f"[red]bench: {current} failed: {type(exc).__name__}: {exc}[/]")
        return 1
    except KeyboardInterrupt:
        console.print("[yellow]bench: interrupted; everything it started is stopped[/]")
        return 130
    summary(done, time.monotonic() - started)
    return 0


def run_one(name: str, admin_dsn: str, args: argparse.Namespace) -> tuple[Path, list[str]]:
    from bench.harness.live import live
    from bench.harness.report import Report

    scenario = timed(name)
    run: Callable[..., Any] = importlib.import_module(f"bench.harness.{scenario.module}").run
    args.variant = scenario.variant
    options = {"quick": args.quick, "procs": args.procs, "external_dsn": bool(args.dsn),
               "stock_pg15": args.stock_pg15, "duration": args.duration,
               "history": args.history, "history_day_s": args.history_day_s}
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
