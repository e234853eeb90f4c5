"""The live progress bar: elapsed against the scenario's time budget, and the running
figures a scenario reports as it goes (rich)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

console = Console(stderr=True)


class Live:
    def __init__(self, progress: Progress, budget_s: float) -> None:
        self.progress = progress
        self.task = progress.add_task("", total=budget_s, figures="")
        self.started = time.monotonic()

    def phase(self, name: str) -> None:
        self.progress.update(self.task, description=name)

    def figures(self, text: str) -> None:
        self.progress.update(self.task, completed=time.monotonic() - self.started,
                             figures=text)

    def log(self, text: str) -> None:
        self.progress.console.print(text)


@contextmanager
def live(scenario: str, budget_s: float) -> Iterator[Live]:
    progress = Progress(
        TextColumn(f"[bold]{scenario}[/] {{task.description}}"),
        BarColumn(bar_width=24),
        TimeElapsedColumn(),
        TextColumn(f"/ {budget_s:.0f} s"),
        TextColumn("{task.fields[figures]}"),
        console=console, refresh_per_second=4, transient=False,
    )
    with progress:
        yield Live(progress, budget_s)
