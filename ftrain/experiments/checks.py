"""The cross-checks of a restart-cost phase: the event log, the metrics, the supervisor's output and the
driver's kill records must agree; every disagreement becomes a problem for the report, never dropped."""

import re
from collections.abc import Sequence
from typing import Final

import msgspec

from ftrain.events.schema import Failed, Resumed
from ftrain.experiments.readings import PhaseInput
from ftrain.experiments.results import Failure
from ftrain.projections.goodput import Goodput
from ftrain.train.metrics import Record

RESUMED_LINE: Final = re.compile(r"^RESUMED from step=(\d+) \(epoch=\d+\)", re.MULTILINE)
FAILED_LINE: Final = re.compile(r"^Attempt \d+ of \d+ failed ", re.MULTILINE)


def count_problems(
    data: PhaseInput, failed: list[Failed], resumed: list[Resumed], restarts: list[Record]
) -> list[str]:
    """Counts that must agree: kills, `failed`, `resumed`, restart lines, RESUMED lines, failed attempts."""
    problems = []
    if data.kills is not None and not len(data.kills) == len(failed) == len(resumed):
        problems.append(
            f"{len(data.kills)} kill(s) but {len(failed)} `failed` and {len(resumed)} `resumed` event(s)"
        )
    elif len(failed) != len(resumed):
        problems.append(f"{len(failed)} `failed` but {len(resumed)} `resumed` event(s)")
    last = max((r.iter for r in data.records if r.iter is not None), default=None)
    training = [e for e in resumed if last is None or e.step < last]  # one at the last step trains nothing
    if len(restarts) != len(training):
        problems.append(
            f"{len(training)} `resumed` event(s) with steps left to train but {len(restarts)} "
            "`train/restart_seconds` line(s) in the metrics"
        )
    if data.stdout is not None:
        lines = [int(step) for step in RESUMED_LINE.findall(data.stdout)]
        logged = [e.step for e in resumed]
        if lines != logged:
            problems.append(
                f"`resumed` events from steps {logged} but `RESUMED from step=` lines say {lines}"
            )
        attempts = len(FAILED_LINE.findall(data.stdout))
        if attempts != len(failed):
            problems.append(f"the supervisor reported {attempts} failed attempt(s), the log {len(failed)}")
    return problems


class LostBound(msgspec.Struct, frozen=True):
    """The most steps a failure may cost: a cadence (the save interval, or `memory_every` with the memory
    tier) plus the steps a copy takes to complete behind the loop (async's copy window, or the snapshot
    window), each named as the report names it."""

    cadence: int | None
    window: int
    names: tuple[str, str] = ("the interval", "copy window")

    def describe(self) -> str:
        return f"{self.names[0]} {self.cadence} + {self.names[1]} {self.window}"


def failure_problems(
    failure: Failure, restart: Record | None, have_kill: bool, bound: LostBound
) -> list[str]:
    """What must hold for one failure: resumed from the newest complete checkpoint (or snapshot), at the
    step after it, losing no more than the bound."""
    n, step = failure.index, failure.resume_step
    problems = []
    if have_kill and failure.newest_complete != step:
        problems.append(
            f"failure {n}: resumed from step {step}, but the newest complete checkpoint at the kill was "
            f"{failure.newest_complete}"
        )
    if restart is not None and restart.iter != step + 1:
        problems.append(
            f"failure {n}: resumed from step {step}, but its first step logged was {restart.iter}"
        )
    lost = failure.lost_steps
    if lost is not None and failure.reached_step is not None and lost < failure.reached_step - step:
        problems.append(
            f"failure {n}: train/lost_steps={lost}, but rank 0 had reached step {failure.reached_step}"
        )
    if lost is not None and bound.cadence is not None and lost > bound.cadence + bound.window:
        problems.append(f"failure {n}: lost {lost} steps, more than {bound.describe()}")
    return problems


def tier_problems(failures: Sequence[Failure], goodput: Goodput | None) -> list[str]:
    """What the memory tier must show: every resume loaded from node memory (an unwarned kill of the job's
    processes leaves every rank's part there), and goodput counting every lost step under `memory`."""
    problems = [
        f"failure {f.index}: resumed from the {f.tier} tier, not from memory"
        for f in failures
        if f.tier != "memory"
    ]
    other = {tier: n for tier, n in (goodput.lost_by_tier if goodput else {}).items() if tier != "memory"}
    if other:
        problems.append(f"goodput: lost steps counted under tiers other than memory: {other}")
    return problems
