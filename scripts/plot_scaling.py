"""Draw `scripts/bench_scaling.py`'s cost curves: seconds against state GB, one panel per figure.

Run: ``.venv/bin/python scripts/plot_scaling.py [docs/scaling.json] [--out docs/scaling.png]``.

Panels: save until durable, the async stall, async until durable, resume cold, resume cached. In each, one
colour per method and one line style per rank count; the legend gives each line's least-squares seconds per GB
(the slope of a line fitted through its points), and a grey line is the machine's limit for that figure,
measured in the same run (disk write, cold disk read or memcpy: seconds = GB ÷ GB/s), so a curve's distance
from it is what the method adds to the hardware. The sixth panel says where and when. Drawn off-screen (Agg);
needs the `experiments` extra. The PNG is small (≈ 150 kB) because the README embeds it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from bench_scaling import LIMIT_NAMES, PANELS, curves, fit
from matplotlib.axes import Axes

HERE = Path(__file__).resolve().parent
COLORS = ("tab:blue", "tab:orange")  # the baseline (raw DCP), then ftrain, in every panel
STYLES = {1: ("-", "o"), 2: ("--", "s"), 4: (":", "^")}


def panel(
    ax: Axes,
    title: str,
    lines: dict[str, dict[int, list[tuple[float, float, float]]]],
    limit: float,
    limit_name: str,
) -> None:
    """One figure's curves, fitted slopes in the legend, and the limit's line under them."""
    top = 0.0
    for color, (method, by_ranks) in zip(COLORS, lines.items(), strict=False):
        for ranks, curve in by_ranks.items():
            xs, ys = [x for x, _, _ in curve], [y for _, y, _ in curve]
            slope, _ = fit(xs, ys)
            style, marker = STYLES.get(ranks, ("-.", "x"))
            ax.plot(
                xs,
                ys,
                style,
                marker=marker,
                color=color,
                lw=1.3,
                ms=4,
                label=f"{method}, {ranks}r: {slope:.2f} s/GB",
            )
            top = max(top, *xs)
    xs = [0.0, top * 1.05]
    ax.plot(
        xs,
        [x / limit for x in xs],
        color="0.5",
        lw=2.5,
        alpha=0.5,
        label=f"{limit_name}: {1 / limit:.2f} s/GB",
    )
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("state, GB (model + AdamW)", fontsize=8)
    ax.set_ylabel("seconds", fontsize=8)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, loc="upper left")


def caption(ax: Axes, grid: dict[str, Any]) -> None:
    """The machine, the load, the limits before and after, the points not run."""
    m, lim = grid["machine"], grid["limits"]
    loads = m["load_1min"]
    lines = [
        f"{m['date'][:16].replace('T', ' ')} UTC, {m['cores']} cores, {m['memory_gb']:.0f} GB, {m['fs']}",
        f"torch {m['torch']}, CPU ranks (gloo, 1 thread each)",
        f"1-min load {min(loads):.1f}–{max(loads):.1f} during the grid",
        f"{grid['repeats']} measured round(s) per point after a warm-up",
        f"grid wall time {grid['wall_s'] / 60:.1f} min",
        "",
        "limits, GB/s (before / after the grid):",
        *(f"  {name}: {lim['before'][k]:.2f} / {lim['after'][k]:.2f}" for k, name in LIMIT_NAMES.items()),
        "",
        "1r/2r/4r: ranks; with more ranks than",
        "cores the ranks are oversubscribed",
    ]
    lines += [f"not run: {s['target_gb']} GB × {s['ranks']}r ({s['why']})" for s in grid["skipped"]]
    lines += [f"failed: {f['target_gb']} GB × {f['ranks']}r (exit {f['rc']})" for f in grid["failed"]]
    ax.axis("off")
    ax.text(0, 1, "\n".join(lines), va="top", fontsize=7.5, family="monospace", wrap=True)


def draw(grid: dict[str, Any], out: Path) -> None:
    """The six panels into `out`."""
    fig, axes = plt.subplots(2, 3, figsize=(13, 7.5))
    flat = list(axes.flat)
    for ax, (title, lines) in zip(flat, curves(grid).items(), strict=False):
        key = PANELS[title][1]
        panel(ax, title, lines, grid["limits"][key], LIMIT_NAMES[key])
    caption(flat[-1], grid)
    fig.suptitle("Checkpoint cost against state size: raw DCP vs ftrain, 1 / 2 / 4 CPU ranks", fontsize=12)
    fig.tight_layout()
    fig.savefig(out, dpi=72)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("json", nargs="?", type=Path, default=HERE.parent / "docs" / "scaling.json")
    parser.add_argument("--out", type=Path, default=HERE.parent / "docs" / "scaling.png")
    args = parser.parse_args(argv)
    draw(json.loads(args.json.read_text()), args.out)
    print(f"plot: {args.out} ({args.out.stat().st_size / 1000:.0f} kB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
