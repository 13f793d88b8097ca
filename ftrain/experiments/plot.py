"""`restart_plot.png` beside `restart_report.md`: the picture of what the failures cost.

Left: training step against elapsed minutes for each phase; each kill is a cross where the attempt died,
joined by a dotted line (the time down) to a dot at the first step after the resume, labelled with the
steps lost and the restart seconds. Right: the median stall per save,
a sync save beside async's stage and drain stacked. Drawn off-screen (Agg); needs the `experiments` extra.
"""

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from ftrain.experiments.report import PLOT, REPORT, markdown
from ftrain.experiments.results import ExperimentResult, PhaseResult
from ftrain.host.atomic_file import write_atomic
from ftrain.host.private_files import private_dir

COLORS = {"baseline": "tab:gray", "sync": "tab:blue", "async": "tab:orange", "memory": "tab:green"}


def _color(phase: str) -> str:
    return COLORS.get(phase, "tab:purple")


def _pieces(p: PhaseResult) -> list[list[tuple[float, int]]]:
    """The phase's curve cut at each kill, so an attempt's progress is one line and a restart a gap."""
    cuts = sorted(f.kill_at for f in p.failures)
    pieces: list[list[tuple[float, int]]] = [[] for _ in range(len(cuts) + 1)]
    for point in p.curve:
        pieces[sum(point[0] > cut for cut in cuts)].append(point)
    return [piece for piece in pieces if piece]


def _progress(ax: Axes, phases: list[PhaseResult]) -> None:
    for n, p in enumerate(phases):
        color = _color(p.phase)
        wall = "" if p.wall_seconds is None else f", {p.wall_seconds / 60:.2f} min"
        label = f"{p.phase} ({p.kind}, {len(p.failures)} failures{wall})"
        for i, piece in enumerate(_pieces(p)):
            xs, ys = zip(*piece, strict=True)
            ax.plot([x / 60 for x in xs], ys, color=color, lw=1.4, label=label if i == 0 else None)
        for f in p.failures:
            if f.reached_step is not None:
                ax.plot(f.kill_at / 60, f.reached_step, "x", color=color, ms=8, mew=2)
            if f.resumed_at is None:
                continue
            resumed = (f.resumed_at / 60, f.resume_step + 1)
            ax.plot(*resumed, "o", color=color, ms=5)
            if f.reached_step is not None:  # the time down: kill → first step after the resume
                ax.plot([f.kill_at / 60, resumed[0]], [f.reached_step, resumed[1]], ":", color=color, lw=1)
            lost = "?" if f.lost_steps is None else f.lost_steps
            restart = "?" if f.restart_seconds is None else f"{f.restart_seconds:.1f}"
            ax.annotate(
                f"{lost} steps lost\n{restart} s restart",
                resumed,
                xytext=(6, -22 - 16 * n),
                textcoords="offset points",
                fontsize=7,
                color=color,
                arrowprops={"arrowstyle": "-", "color": color, "lw": 0.6},
            )
    ax.set_xlabel("elapsed (minutes since the first step began)")
    ax.set_ylabel("training step")
    ax.set_title("progress: × kill, ● first step after the resume (steps lost, restart_seconds)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)


def _stalls(ax: Axes, phases: list[PhaseResult]) -> None:
    names, labelled = [], set()

    def once(label: str) -> str | None:
        """A legend entry per kind of bar, not per bar."""
        first = label not in labelled
        labelled.add(label)
        return label if first else None

    for x, p in enumerate(phases):
        st, color = p.stall, _color(p.phase)
        names.append(f"{p.phase}\n{p.kind}, n={st.saves}")
        if p.async_ckpt:
            stage, drain = st.median_stage or 0.0, st.median_drain or 0.0
            ax.bar(x, stage, color=color, label=once("async stage"))
            ax.bar(x, drain, bottom=stage, color=color, alpha=0.45, hatch="//", label=once("async drain"))
            top = stage + drain
        else:
            top = st.median_save or 0.0
            ax.bar(x, top, color=color, label=once("sync save"))
        ax.annotate(f"{top:.3f} s", (x, top), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(phases)), names, fontsize=8)
    ax.set_ylabel("median stall per save (s)")
    ax.set_title("training-loop stall per save", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)


def draw(result: ExperimentResult, path: Path) -> None:
    """Render the two panels to `path` (PNG)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.5), gridspec_kw={"width_ratios": [2.3, 1]})
    _progress(left, result.phases)
    _stalls(right, result.phases)
    fig.suptitle(result.title.replace("`", ""), fontsize=11)
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=120)
    plt.close(fig)
    write_atomic(path, image.getvalue())  # 0600: an experiment's figures are its user's, like its log


def publish(result: ExperimentResult, directory: Path) -> tuple[Path, Path]:
    """Write `restart_plot.png` and `restart_report.md` into `directory`; returns their paths."""
    private_dir(directory, tighten=False)  # missing parents 0700 whatever the umask; the user's own kept
    plot, report = directory / PLOT, directory / REPORT
    draw(result, plot)
    write_atomic(report, markdown(result).encode())
    return plot, report
