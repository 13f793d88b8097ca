"""A run's goodput (`projections.goodput`) as people and consumers read it: `status`'s line, `cost --run`'s
table, and the JSON document both `--json` outputs carry. A term the log cannot give reads `unknown`, never 0."""

from typing import Any

from ftrain.cli.render import table
from ftrain.events.schema import SNAPSHOT_TIERS
from ftrain.projections.goodput import TERMS, Goodput

UNKNOWN = "unknown"
LABELS = {
    "productive": "productive",
    "checkpoint_stall": "checkpoint stall",
    "startup": "start-up",
    "restart": "restart",
    "down": "down",
    "recomputed": "recomputed",
}


def duration(seconds: float) -> str:
    """`84.2 s`, `12.5 min`, `36.2 h`: a figure a person reads at a glance."""
    if seconds < 100:
        return f"{seconds:.1f} s"
    if seconds < 6000:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def share(seconds: float | None, wall: float) -> str:
    """A term's share of the wall time: `12.5 %`, or `—` when unknown."""
    return "—" if seconds is None or wall <= 0 else f"{seconds / wall * 100:.1f} %"


def status_line(g: Goodput) -> str:
    """`goodput     71.2 % (84.2 s productive of 118.3 s wall)`."""
    wall = duration(g.wall)
    if g.ratio is None or g.productive is None:
        return f"goodput     {UNKNOWN} ({wall} wall; its events do not say how long training took)"
    return f"goodput     {g.ratio * 100:.1f} % ({duration(g.productive)} productive of {wall} wall)"


def notes(g: Goodput, status: str) -> dict[str, str]:
    """What each term is, in words, for this run (`cost --run`'s WHAT column and the web view's)."""
    restarts = g.attempts - 1
    lost = UNKNOWN if g.lost_steps is None else str(g.lost_steps)
    pace = UNKNOWN if g.step_seconds is None else f"{g.step_seconds:.3f} s"
    return {
        "wall": "launched → " + ("completed" if status == "completed" else "now"),
        "productive": "training time of the steps the run kept",
        "checkpoint_stall": f"{g.saves} save(s) holding the training loop",
        "startup": "launched → the first training step",
        "restart": f"{restarts} restart(s): resumed → training again",
        "down": f"{g.failures} failure(s): failed → resumed" + (" (→ now)" if status == "failed" else ""),
        "recomputed": (
            f"{lost} step(s) lost × {pace} a step"
            if g.recomputed is None or g.recomputed_estimated
            else f"{lost} step(s) lost, timed by the attempts that ran them"
        )
        + (f" ({tiers})" if (tiers := by_tier(g)) else ""),
        "other": "teardown after failures, work after the newest checkpoint, estimates' error"
        + (f"; includes the unknown {', '.join(LABELS[t] for t in g.unknown)}" if g.unknown else ""),
    }


def by_tier(g: Goodput) -> str:
    """`memory 4, durable 15`: the lost steps by the tier each resume loaded from, once the memory tier
    served one (empty otherwise: every resume was from durable storage)."""
    if not any(tier in g.lost_by_tier for tier in SNAPSHOT_TIERS):
        return ""
    return ", ".join(f"{tier} {steps}" for tier, steps in sorted(g.lost_by_tier.items(), reverse=True))


def breakdown(run_id: str, status: str, g: Goodput) -> list[str]:
    """`cost --run`: the headline, then every term with its time, its share of the wall time and what it is."""
    what = notes(g, status)
    ratio = UNKNOWN if g.ratio is None else f"{g.ratio * 100:.1f} %"
    rows = [("wall time", duration(g.wall), share(g.wall, g.wall), what["wall"])]
    for term in TERMS:
        seconds: float | None = getattr(g, term)
        text = UNKNOWN if seconds is None else duration(seconds)
        rows.append((LABELS[term], text, share(seconds, g.wall), what[term]))
    rows.append(("other", duration(g.other), share(g.other, g.wall), what["other"]))
    return [f"Goodput of {run_id} ({status}): {ratio} of its wall time trained steps it kept",
            *table(("TERM", "TIME", "SHARE", "WHAT"), rows)]  # fmt: skip


def document(g: Goodput) -> dict[str, Any]:
    """The `goodput` member of `status --json` and `cost --run --json`: seconds to the millisecond, null
    where the log cannot tell, and which terms those are."""

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value, 3)

    return {
        "ratio": None if g.ratio is None else round(g.ratio, 6),
        "wall_seconds": ms(g.wall),
        **{f"{term}_seconds": ms(getattr(g, term)) for term in TERMS},
        "other_seconds": ms(g.other),
        "unknown": g.unknown,
        "attempts": g.attempts,
        "failures": g.failures,
        "saves": g.saves,
        "lost_steps": g.lost_steps,
        "step_seconds": None if g.step_seconds is None else round(g.step_seconds, 6),
        "recomputed_estimated": g.recomputed_estimated,
        "lost_steps_by_tier": g.lost_by_tier,
    }
