#!/usr/bin/env python3
"""Plots monitoring/dashboard.json's panels, laid out as Grafana lays them
out, from the answers a real Prometheus gave to each panel's queries: the
README's picture of the dashboard (docs/dashboard.png).

The data comes from tests/it/prometheus.rs, which runs Prometheus against two
real agents and, with GHA_DASHBOARD_DUMP set, writes every panel query's
range answer to a file:

    GHA_DASHBOARD_DUMP=$PWD/target/dashboard-dump.json cargo test --test it -- prometheus::
    python3 scripts/dashboard-png.py target/dashboard-dump.json docs/dashboard.png

Needs matplotlib (pip install matplotlib).
"""
import json
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BG, PANEL, GRID, TEXT = "#111217", "#181b1f", "#2c3235", "#ccccdc"


def scaled(v, steps, unit):
    """v with the largest prefix of `steps` (factor, suffix) it reaches."""
    for factor, suffix in steps:
        if abs(v) >= factor:
            return f"{v / factor:.3g} {suffix}{unit}"
    return f"{v:.3g} {unit}" if v else f"0 {unit}"


def fmt(unit):
    if unit == "s":
        return lambda v, _: scaled(v, [(3600, "h"), (60, "min"), (1, "s"), (1e-3, "ms"), (1e-6, "µs")], "").strip()
    if unit == "percentunit":
        return lambda v, _: f"{v * 100:.3g}%"
    if unit in ("bytes", "Bps"):
        suffix = "B/s" if unit == "Bps" else "B"
        return lambda v, _: scaled(v, [(2**30, "Gi"), (2**20, "Mi"), (2**10, "Ki")], suffix)
    if unit in ("reqps", "ops"):
        return lambda v, _: f"{v:.3g}/s"
    return lambda v, _: f"{v:.4g}"


def legend(template, labels):
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template).strip() or str(labels)


def main(dump_path, out_path):
    dump = json.loads(Path(dump_path).read_text())
    dashboard = json.loads((ROOT / "monitoring" / "dashboard.json").read_text())
    t0 = dump["from"]
    by_panel = {}
    for q in dump["queries"]:
        by_panel.setdefault(q["panel"], []).append(q)

    panels = dashboard["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    fig = plt.figure(figsize=(24, rows * 0.42), facecolor=BG)
    grid = fig.add_gridspec(rows, 24, hspace=0.0, wspace=0.0, left=0.01, right=0.99, top=0.975, bottom=0.01)
    fig.suptitle(
        f"{dashboard['title']}: two agents scraped every second by a real Prometheus "
        f"(tests/it/prometheus.rs; consul killed and restored during the run)",
        color=TEXT, fontsize=13, x=0.01, y=0.997, ha="left",
    )
    for p in panels:
        g = p["gridPos"]
        if p["type"] == "row":
            ax = fig.add_subplot(grid[g["y"]:g["y"] + 1, :])
            ax.set_axis_off()
            ax.text(0.0, 0.2, p["title"], color=TEXT, fontsize=12, fontweight="bold", transform=ax.transAxes)
            continue
        inner = grid[g["y"]:g["y"] + g["h"], g["x"]:g["x"] + g["w"]].subgridspec(
            1, 1, wspace=0, hspace=0)
        ax = fig.add_subplot(inner[0])
        # Room for the title and the axis labels inside the panel's cell.
        box = ax.get_position()
        ax.set_position([box.x0 + 0.035 * box.width * 24 / g["w"] / 3, box.y0 + 0.16 * box.height,
                         box.width * (1 - 0.035 * 24 / g["w"] / 3) - 0.004, box.height * 0.68])
        ax.set_facecolor(PANEL)
        ax.set_title(p["title"], color=TEXT, fontsize=10, loc="left")
        unit = p["fieldConfig"]["defaults"].get("unit", "")
        ax.yaxis.set_major_formatter(FuncFormatter(fmt(unit)))
        ax.tick_params(colors=TEXT, labelsize=7)
        ax.grid(color=GRID, linewidth=0.5)
        for side in ax.spines.values():
            side.set_color(GRID)
        lines = 0
        for q in by_panel.get(p["title"], []):
            for series in q["result"]:
                xs = [float(t) - t0 for t, _ in series["values"]]
                ys = [float(v) for _, v in series["values"]]
                ax.plot(xs, ys, linewidth=1.2, label=legend(q["legend"], series["metric"]))
                lines += 1
        ax.set_xlim(0, dump["to"] - t0)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0f}s"))
        if lines:
            ax.legend(fontsize=6, loc="upper left", ncol=2 if lines > 4 else 1, facecolor=PANEL,
                      edgecolor=GRID, labelcolor=TEXT, framealpha=0.8)
        else:
            ax.text(0.5, 0.5, "no data", color=TEXT, ha="center", transform=ax.transAxes)
    fig.savefig(out_path, dpi=72, facecolor=BG)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: scripts/dashboard-png.py DUMP.json OUT.png")
    main(sys.argv[1], sys.argv[2])
