"""Goodput: how much of a run's wall time went into steps the run kept, and where the rest went, from its
events alone (the effective training time ratio). Pure: the run's accepted events and a moment in, figures out.

The trainer's rank 0 reports on each `checkpointed` what it measured (`stall_seconds`, `train_seconds`,
`loop_seconds`, `lost_steps`); the supervisor's events (`launched`, `failed`, `resumed`, `completed`) mark
when each attempt opened and closed. The terms, in seconds, sum to the wall time:

- wall: `launched` → `completed` (or now, while the run is running or failed).
- productive: per attempt, the `train_seconds` of its newest checkpoint no resume refused (0 for an attempt
  without one), or of its memory snapshot the next attempt resumed from: the training time of the steps the
  run kept.
- checkpoint stall: `stall_seconds` summed over every checkpoint (each reports the stall since the attempt's
  previous one).
- start-up: `launched` → the first attempt's training-loop start (its checkpoint's `time − loop_seconds`):
  launching the processes, imports, process group, model build.
- restart: each later attempt's opening `resumed` → its training-loop start: launching, start-up, verifying
  and loading the checkpoint.
- down: each `failed` → the `resumed` that opens the next attempt (backoff, waiting for nodes or an operator);
  for a failed run, its last `failed` → now.
- recomputed: per restart, the `lost_seconds` its trainer read from the failed attempt's metrics (the loop time
  of the steps it re-does); without them, an estimate: its `lost_steps` × the failed attempt's seconds per step
  (its last checkpoint's `train_seconds` ÷ the steps it trained to it; the run's mean when it recorded none).
- other: the wall time less the terms above: after each failure, its last step → `failed` (teardown, the
  partial step), an attempt's work after its newest checkpoint while it runs or before it completes (its last
  steps, the final drain, exit), and the estimate's error. A term the events cannot give (a trainer from before
  these fields, an attempt that died before its first checkpoint) is None, and its time is inside `other`.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import pairwise

import msgspec
from msgspec import UNSET, UnsetType

from ftrain.events import schema
from ftrain.events.schema import AnyEvent, Checkpointed, Completed, CorruptSkipped, Failed, Launched, Resumed

TERMS = ("productive", "checkpoint_stall", "startup", "restart", "down", "recomputed")
"""The measured terms, in the order they are shown; `other` is what they leave of the wall time."""


class Goodput(msgspec.Struct, frozen=True, kw_only=True):
    """A run's wall time split into its terms (seconds; None: the events cannot tell), with the counts the
    terms are sums over."""

    wall: float
    productive: float | None
    checkpoint_stall: float | None
    startup: float | None
    restart: float | None
    down: float
    recomputed: float | None
    other: float
    attempts: int
    failures: int
    saves: int
    lost_steps: int | None
    step_seconds: float | None
    """The run's mean seconds per step (None: no attempt measured one)."""
    recomputed_estimated: bool = False
    """Whether a restart's recomputed time is lost steps × a pace (its trainer did not time the lost steps)."""
    lost_by_tier: dict[str, int] = msgspec.field(default_factory=dict)
    """The lost steps of the restarts that reported them, by the tier that served each one's resume
    (`durable`, `memory`, `peer`): what the memory tier saves shows here."""

    @property
    def ratio(self) -> float | None:
        """Productive time ÷ wall time (None when either cannot tell)."""
        return None if self.productive is None or self.wall <= 0 else self.productive / self.wall

    @property
    def unknown(self) -> list[str]:
        """The terms the events cannot give: their time is inside `other`."""
        return [name for name in TERMS if getattr(self, name) is None]


@dataclass
class _Attempt:
    """One start of the training processes: opened by `launched` or `resumed` (from a step), its
    checkpoints, and the `failed` that ended it, if one did."""

    opened: datetime
    from_step: int
    failed_at: datetime | None = None
    saves: list[Checkpointed] = field(default_factory=list)
    tier: str = "durable"
    """The tier its resume loaded from: `durable`, or `memory` or `peer` (a `resumed` naming it)."""
    snapshots: dict[int, schema.Snapshotted] = field(default_factory=dict)
    """Its memory snapshots by step: a later attempt's resume from one keeps its steps."""

    @property
    def loop_start(self) -> datetime | None:
        """When its training loop started, as its first checkpoint that says so reports it."""
        for save in self.saves:
            if save.loop_seconds is not UNSET:
                return save.time - timedelta(seconds=save.loop_seconds)
        return None

    @property
    def lost_steps(self) -> int | None:
        """The steps its resume re-did, as its first checkpoint that says so reports them."""
        return next((s.lost_steps for s in self.saves if s.lost_steps is not UNSET), None)

    @property
    def lost_seconds(self) -> float | None:
        """Their time in the failed attempt's loop, as its first checkpoint that says so reports it."""
        return next((s.lost_seconds for s in self.saves if s.lost_seconds is not UNSET), None)

    def kept(self, refused: set[int], resumed: "_Attempt | None") -> float | None:
        """Training seconds to its newest checkpoint no resume refused (0: none; None: not reported), or to
        its memory snapshot the `resumed` attempt loaded, when that reported them."""
        snapshot = self.snapshots.get(resumed.from_step) if resumed and resumed.tier != "durable" else None
        if snapshot is not None and snapshot.train_seconds is not UNSET:
            return snapshot.train_seconds
        valid = [s for s in self.saves if s.seq not in refused]
        if not valid:
            return 0.0
        return _known(valid[-1].train_seconds)

    def pace(self) -> tuple[float, int] | None:
        """(training seconds, steps trained) at its last checkpoint, when it reported them and trained any."""
        if not self.saves:
            return None
        last = self.saves[-1]
        steps = last.step - self.from_step
        if last.train_seconds is UNSET or steps <= 0:
            return None
        return last.train_seconds, steps

    def start_up(self) -> float | None:
        """Its opening event → its training-loop start (None: no checkpoint reported the start)."""
        start = self.loop_start
        return None if start is None else _seconds(self.opened, start)


def _seconds(start: datetime, end: datetime) -> float:
    """`end − start` in seconds; never negative (clocks of two hosts may disagree by a little)."""
    return max((end - start).total_seconds(), 0.0)


def _sum(values: Sequence[float | None]) -> float | None:
    """The sum, or None when any part is unknown."""
    return None if None in values else sum(v for v in values if v is not None)


class _Fold:
    """The attempts of one run, folded from its events in chain order."""

    def __init__(self, launched: Launched) -> None:
        self.launched = launched
        self.attempts = [_Attempt(launched.time, 0)]
        self.number = 1
        self.refused: set[int] = set()
        self.completed: datetime | None = None

    def feed(self, event: AnyEvent) -> None:
        current = self.attempts[-1]
        if isinstance(event, Checkpointed):
            current.saves.append(event)
        elif isinstance(event, schema.Snapshotted):
            current.snapshots[event.step] = event
        elif isinstance(event, Failed):
            current.failed_at = event.time
        elif isinstance(event, Resumed):
            self._resumed(event)
        elif isinstance(event, CorruptSkipped):
            self.refused.add(event.checkpoint_seq)
        elif isinstance(event, Completed):
            self.completed = event.time

    def _resumed(self, event: Resumed) -> None:
        """A `resumed` starts the processes again: it opens the next attempt, or restarts the failed one in
        place; in a running attempt it says the trainer fell back to an older checkpoint at its start-up."""
        opened = event.attempt or self.number + 1
        tier = event.tier if isinstance(event.tier, str) else "durable"
        if opened == self.number and self.attempts[-1].failed_at is None:
            self.attempts[-1].from_step, self.attempts[-1].tier = event.step, tier
            return
        self.attempts.append(_Attempt(event.time, event.step, tier=tier))
        self.number = opened

    def down(self, end: datetime) -> float:
        """`failed` → the next attempt's opening, each time; and → `end` while the run is failed."""
        down = sum(
            _seconds(b.failed_at, a.opened) for b, a in pairwise(self.attempts) if b.failed_at is not None
        )
        last = self.attempts[-1].failed_at
        return down + (0.0 if last is None else _seconds(last, end))

    def step_seconds(self) -> float | None:
        """The run's mean seconds per step over the attempts that measured it."""
        paces = [p for a in self.attempts if (p := a.pace()) is not None]
        steps = sum(n for _, n in paces)
        return sum(s for s, _ in paces) / steps if steps else None

    def recomputed(self) -> tuple[float | None, bool]:
        """Each restart's timed lost steps, or its lost steps × the seconds per step of the attempt that lost
        them; and whether any was such an estimate."""
        mean = self.step_seconds()
        parts: list[float | None] = []
        estimated = False
        for before, after in pairwise(self.attempts):
            lost, timed = after.lost_steps, after.lost_seconds
            if lost is None or lost == 0 or timed is not None:
                parts.append(None if lost is None else 0.0 if lost == 0 else timed)
                continue
            pace = before.pace()
            parts.append(_times(lost, pace[0] / pace[1] if pace else mean))
            estimated = True
        return _sum(parts), estimated

    def result(self, now: datetime) -> Goodput:
        end = now if self.completed is None else self.completed
        first, *later = self.attempts
        lost = [a.lost_steps for a in later]
        productive = _sum(
            [a.kept(self.refused, b) for a, b in zip(self.attempts, [*later, None], strict=True)]
        )
        stall = _sum([_known(s.stall_seconds) for a in self.attempts for s in a.saves])
        startup, restart = first.start_up(), _sum([a.start_up() for a in later])
        down, (recomputed, estimated) = self.down(end), self.recomputed()
        wall = _seconds(self.launched.time, end)
        known = [t for t in (productive, stall, startup, restart, down, recomputed) if t is not None]
        return Goodput(
            wall=wall,
            productive=productive,
            checkpoint_stall=stall,
            startup=startup,
            restart=restart,
            down=down,
            recomputed=recomputed,
            other=wall - sum(known),
            attempts=len(self.attempts),
            failures=sum(a.failed_at is not None for a in self.attempts),
            saves=sum(len(a.saves) for a in self.attempts),
            lost_steps=None if None in lost else sum(n for n in lost if n is not None),
            step_seconds=self.step_seconds(),
            recomputed_estimated=estimated,
            lost_by_tier=_by_tier(later),
        )


def _by_tier(restarts: Sequence[_Attempt]) -> dict[str, int]:
    """The lost steps of the restarts that reported them, summed by the tier each resumed from."""
    lost: dict[str, int] = {}
    for attempt in restarts:
        if attempt.lost_steps is not None:
            lost[attempt.tier] = lost.get(attempt.tier, 0) + attempt.lost_steps
    return lost


def _known(value: float | UnsetType) -> float | None:
    return None if value is UNSET else value


def _times(steps: int, per_step: float | None) -> float | None:
    return None if per_step is None else steps * per_step


def _folded(events: Sequence[AnyEvent]) -> _Fold:
    launched = events[0]
    if not isinstance(launched, Launched):
        raise ValueError(f"a run's events begin with `launched`, not {type(launched).__name__}")
    fold = _Fold(launched)
    for event in events[1:]:
        fold.feed(event)
    return fold


def measure(events: Sequence[AnyEvent], now: datetime) -> Goodput:
    """The goodput of the run whose accepted events, in chain order, are `events` (the first: `launched`),
    as of `now` (used while the run has not completed)."""
    return _folded(events).result(now)


class AttemptSpan(msgspec.Struct, frozen=True):
    """One attempt as the goodput fold delimits it, for views that draw it: when it opened and from which
    step, when it failed (None: it did not), its checkpoints, and the steps its resume re-did (None: not
    reported; the first attempt re-does none)."""

    opened: datetime
    from_step: int
    failed_at: datetime | None
    saves: tuple[Checkpointed, ...]
    lost_steps: int | None


def attempt_spans(events: Sequence[AnyEvent]) -> list[AttemptSpan]:
    """The attempts of the run whose accepted events are `events` (as `measure` takes them), oldest first."""
    return [
        AttemptSpan(a.opened, a.from_step, a.failed_at, tuple(a.saves), a.lost_steps if n else 0)
        for n, a in enumerate(_folded(events).attempts)
    ]
