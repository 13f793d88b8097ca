"""The goodput cross-check of a restart-cost phase: what `ftrain cost --run` derives from the event log alone
(`projections.goodput`) against the same terms measured from rank 0's metrics. Pure: no I/O.

Measured, with the log's `launched`, opening `resumed` and `completed` times as the only shared anchors (wall
and down time are the log's own, on both sides):

- productive: the loop time of every step that counts (one a failure did not throw away: up to the checkpoint
  or memory snapshot the next attempt resumed from, or the last checkpoint), from the previous step's line to
  its own, less the stall lines between (an attempt's first step: its `train/dt`);
- checkpoint stall: the stall lines (sync save, or async stage + drain, and memory snapshots' stage) up to
  each attempt's last save the log recorded;
- start-up: `launched` → the start of the first step (its line's time − its `train/dt`);
- restart: each opening `resumed` → the start of the first step after it;
- recomputed: the loop time of the steps each failure threw away;
- lost steps: `train/lost_steps` summed over the resumes.

They agree when every term is equal within rounding (0.1 s; then so is the goodput, over the same wall time)
and the lost steps exactly. Recomputed too, where the resumed trainer timed the lost steps from the failed
attempt's metrics; where the log estimates it instead (lost steps × the attempt's mean seconds per step: a
trainer that did not time them), its time need only be within half the measured, or 0.1 s: the steps a failure
throws away are not average ones (an async save's background work slows the steps right after it).
"""

from collections.abc import Sequence
from typing import Final

import msgspec
from msgspec import UNSET

from ftrain.events.schema import AnyEvent, Checkpointed, Completed, Launched, Resumed
from ftrain.projections.goodput import Goodput, measure
from ftrain.train.metrics import Record, loop_times, segments

ROUNDING_S: Final = 0.1
ESTIMATE_SHARE: Final = 0.5
COMPARED: Final = ("productive", "checkpoint_stall", "startup", "restart", "recomputed")


class Measured(msgspec.Struct, frozen=True, kw_only=True):
    """The goodput terms as the metrics measure them (seconds)."""

    wall: float
    productive: float
    checkpoint_stall: float
    startup: float | None
    restart: float | None
    recomputed: float
    lost_steps: int | None

    @property
    def ratio(self) -> float | None:
        return self.productive / self.wall if self.wall > 0 else None


class GoodputCheck(msgspec.Struct, frozen=True, kw_only=True):
    """One phase's goodput from the log and from the metrics (None: the log predates the trainer's goodput
    fields, or the metrics do not pair with its attempts, a problem the count checks report)."""

    log: Goodput
    measured: Measured | None


class AttemptResume(msgspec.Struct, frozen=True):
    """How an attempt after the first began: the `resumed` that opened it (a supervisor's relaunch, from
    durable storage), and the one it trained from: the same, or the last a trainer continued the attempt
    with (a fallback to an older checkpoint, or a memory snapshot newer than the durable one)."""

    opening: Resumed
    effective: Resumed


def attempt_resumes(events: Sequence[AnyEvent]) -> list[AttemptResume]:
    """Each attempt's resume after the first, in order."""
    out: list[AttemptResume] = []
    number = 1
    for event in events:
        if not isinstance(event, Resumed):
            continue
        if (event.attempt or number + 1) != number:
            out.append(AttemptResume(event, event))
            number = event.attempt or number + 1
        elif out:
            out[-1] = AttemptResume(out[-1].opening, event)
    return out


def _attempt_steps(events: Sequence[AnyEvent], openings: Sequence[Resumed]) -> list[set[int]]:
    """The checkpointed steps of each attempt, in order."""
    out: list[set[int]] = [set()]
    for event in events:
        if any(event is o for o in openings):
            out.append(set())
        elif isinstance(event, Checkpointed):
            out[-1].add(event.step)
    return out


def _attempt(
    part: Sequence[Record], upto: int, recorded: set[int], failed: bool
) -> tuple[float, float, float]:
    """(productive, recomputed, stall) of one attempt's lines; `upto`: its last step the run kept."""
    last_recorded = max((i for i, r in enumerate(part) if r.is_save and r.iter in recorded), default=-1)
    stall = sum(r.stall for i, r in enumerate(part) if (r.is_save or r.is_snapshot) and i <= last_recorded)
    productive = recomputed = 0.0
    for step, seconds in loop_times(part):
        if step <= upto:
            productive += seconds
        elif failed:
            recomputed += seconds
    return productive, recomputed, stall


def _start(part: Sequence[Record]) -> float | None:
    first = next((r for r in part if r.is_step), None)
    return None if first is None or first.dt is None else first.time - first.dt


def measured(events: Sequence[AnyEvent], records: Sequence[Record]) -> Measured | None:
    """The terms from rank 0's metrics, or None when its attempts do not pair with the log's."""
    launched = next((e for e in events if isinstance(e, Launched)), None)
    completed = next((e for e in events if isinstance(e, Completed)), None)
    saves = [e.step for e in events if isinstance(e, Checkpointed)]
    resumes = attempt_resumes(events)
    openings = [r.opening for r in resumes]
    parts = segments(records)
    if launched is None or completed is None or not saves or len(parts) != len(openings) + 1:
        return None
    kept_to = [r.effective.step for r in resumes] + [saves[-1]]
    attempts = zip(parts, kept_to, _attempt_steps(events, openings), strict=True)
    figures = [
        _attempt(part, upto, steps, i < len(openings)) for i, (part, upto, steps) in enumerate(attempts)
    ]
    productive, recomputed, stall = (sum(f[k] for f in figures) for k in range(3))
    starts = [_start(part) for part in parts]
    restarts = [
        None if s is None else s - o.time.timestamp() for s, o in zip(starts[1:], openings, strict=True)
    ]
    lost = [part[0].lost_steps for part in parts[1:]]
    return Measured(
        wall=(completed.time - launched.time).total_seconds(),
        productive=productive,
        checkpoint_stall=stall,
        startup=None if starts[0] is None else starts[0] - launched.time.timestamp(),
        restart=None if None in restarts else sum(r for r in restarts if r is not None),
        recomputed=recomputed,
        lost_steps=None if None in lost else sum(n for n in lost if n is not None),
    )


def _measuring(events: Sequence[AnyEvent]) -> bool:
    """Whether the trainer reported its measurements (a log from before them has none to check)."""
    return any(isinstance(e, Checkpointed) and e.train_seconds is not UNSET for e in events)


def check_goodput(events: Sequence[AnyEvent], records: Sequence[Record]) -> GoodputCheck | None:
    """The phase's goodput both ways (None without a `launched` event)."""
    if not events or not isinstance(events[0], Launched):
        return None
    completed = next((e for e in events if isinstance(e, Completed)), None)
    now = completed.time if completed else events[-1].time
    metrics = measured(events, records) if _measuring(events) else None
    return GoodputCheck(log=measure(events, now), measured=metrics)


def _estimate(log: Goodput, term: str) -> bool:
    return term == "recomputed" and log.recomputed_estimated


def disagreements(check: GoodputCheck) -> list[str]:
    """Each term the log and the metrics do not give equal within rounding."""
    log, metrics = check.log, check.measured
    if metrics is None:
        return []
    problems = []
    for term in COMPARED:
        a, b = getattr(log, term), getattr(metrics, term)
        if a is None or b is None:
            problems.append(f"goodput: {term} is unknown from the {'log' if a is None else 'metrics'}")
        elif abs(a - b) > max(ROUNDING_S, ESTIMATE_SHARE * b if _estimate(log, term) else 0.0):
            problems.append(f"goodput: {term} {a:.2f} s from the log, {b:.2f} s from the metrics")
    if log.lost_steps != metrics.lost_steps:
        problems.append(
            f"goodput: {log.lost_steps} lost steps in the log, {metrics.lost_steps} in the metrics"
        )
    return problems
