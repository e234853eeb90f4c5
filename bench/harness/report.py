"""Where a scenario's numbers go. The timed scenarios (throughput, slow-destination,
dead-destination, contention, bloat) leave a folder bench/reports/<UTC time>-<scenario>/
with report.json (every number and the settings), report.md (tables with the plots
embedded) and PNG plots; the drains, peers and ingress write one JSON file each
(`save_json`)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.harness import stack

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

REPORTS = stack.ROOT / "bench" / "reports"


def save_json(folder: Path, name: str, data: dict[str, Any]) -> Path:
    """Write `data` as `<name>-<UTC stamp>.json` in `folder` (made if missing)."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{stamp}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def _pyplot() -> Any:
    """matplotlib's pyplot drawing to files only (no display on a bench machine), imported
    only by the scenarios that plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


class Report:
    """Collects a scenario's numbers, Markdown and plots; `save` writes the folder."""

    def __init__(self, scenario: str, options: dict[str, Any], root: Path = REPORTS) -> None:
        self.started = dt.datetime.now(dt.UTC)
        self.folder = root / f"{self.started.strftime('%Y%m%dT%H%M%SZ')}-{scenario}"
        self.data: dict[str, Any] = {
            "scenario": scenario, "started_at": self.started.isoformat(),
            "options": options, "git_commit": stack.git_commit(),
            "machine": stack.machine(),
        }
        self.markdown: list[str] = []
        self.headline: list[str] = []  # the summary's lines, also on the terminal

    def section(self, title: str, text: str = "") -> None:
        self.markdown += [f"## {title}", "", *([text, ""] if text else [])]

    def table(self, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
        self.markdown.append("| " + " | ".join(header) + " |")
        self.markdown.append("|" + "---|" * len(header))
        for row in rows:
            self.markdown.append("| " + " | ".join(_cell(v) for v in row) + " |")
        self.markdown.append("")

    def plot(self, figure: Figure, name: str, caption: str) -> None:
        figure.tight_layout()
        self.folder.mkdir(parents=True, exist_ok=True)
        figure.savefig(self.folder / name, dpi=110)
        _pyplot().close(figure)
        self.markdown += [f"![{caption}]({name})", ""]
        self.data.setdefault("plots", []).append(name)

    def save(self) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.data["finished_at"] = dt.datetime.now(dt.UTC).isoformat()
        self.data["machine"]["load_average_at_end"] = stack.machine()["load_average"]
        self.data["headline"] = self.headline
        (self.folder / "report.json").write_text(json.dumps(self.data, indent=2, default=str)
                                                 + "\n")
        title = (f"# bench: {self.data['scenario']} — {self.started:%Y-%m-%d %H:%M} UTC\n\n"
                 f"Commit `{self.data['git_commit']}`, {self.data['machine']['cpus']} CPUs, "
                 f"load average {self.data['machine']['load_average']} at start "
                 f"(other work on the machine depresses every number). "
                 f"PostgreSQL: {_pg_line(self.data.get('postgres', {}))}\n\n"
                 + "".join(f"- {line}\n" for line in self.headline) + "\n")
        (self.folder / "report.md").write_text(title + "\n".join(self.markdown) + "\n")
        return self.folder


def _pg_line(settings: dict[str, str]) -> str:
    keys = ("server_version", "fsync", "synchronous_commit", "jit", "shared_buffers",
            "autovacuum_naptime", "autovacuum_vacuum_cost_delay")
    return ", ".join(f"{k}={settings[k]}" for k in keys if k in settings) or "n/a"


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def figure(title: str, size: tuple[float, float] = (8, 4.2)) -> tuple[Figure, Axes]:
    fig, ax = _pyplot().subplots(figsize=size)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    return fig, ax


def figure_rows(title: str, rows: int, size: tuple[float, float] = (8, 6.5)
                ) -> tuple[Figure, Sequence[Axes]]:
    fig, axes = _pyplot().subplots(rows, 1, figsize=size, sharex=True)
    fig.suptitle(title)
    for ax in axes:
        ax.grid(True, alpha=0.3)
    return fig, axes
