"""`engine demo [--duration S]`: the engine end to end on this machine, in one command.

An embedded database (unless --dsn), the engine itself (`engine run` as a child process),
fake receivers (healthy, slow, flaky, dead, gone-after-a-while), a stream of events over
the HTTP API, a live view, a summary; then everything it started is stopped.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

DEFAULT_DURATION_S = 60.0


def register(sub: Any) -> None:
    parser = sub.add_parser("demo", help="see the engine work: fake receivers, live view")
    parser.add_argument("--dsn", default=argparse.SUPPRESS,
                        help="PostgreSQL URL (default: the embedded server in ./.engine/)")
    parser.add_argument("--duration", type=float, default=DEFAULT_DURATION_S, metavar="S",
                        help=f"seconds to run (default {DEFAULT_DURATION_S:.0f})")
    parser.add_argument("--rate", type=float, default=5.0, metavar="N",
                        help="events per second sent (default 5; each goes to 5 receivers)")


def run_demo(settings: Any, args: argparse.Namespace) -> int:
    from engine.demo.runner import run

    try:
        return run(settings, args.duration, args.rate)
    except KeyboardInterrupt:  # before the live view started; everything is stopped
        print("engine demo: interrupted before it started", file=sys.stderr)
        return 130
