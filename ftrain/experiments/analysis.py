"""What a failure cost, from the event log and the metrics, each checked against the other. Pure: no I/O.

Per phase: the failures (the kill, the checkpoint that was newest at it, the resume, the steps lost, the
restart seconds), the stall per save, the wall-clock, the final parameter digest. Per phase with failures:
its overhead over the baseline, split into relaunch (kill → the new trainer process), restart (process start
→ first step, the trainer's `train/restart_seconds`), recomputation (the killed attempt's time past the
checkpoint it resumed from), and the changes in save stall and in the time of the steps that count (a
background save or a busy machine slows them); what that does not explain is shown as the residual.
Every disagreement between the sources (`checks`) is kept as a problem for the report, never dropped.
"""

import re
import statistics
from collections.abc import Sequence
from datetime import datetime
from itertools import pairwise
from typing import Final

from ftrain.events.schema import AnyEvent, Checkpointed, Completed, Failed, Launched, Resumed, Snapshotted
from ftrain.experiments.checks import LostBound, count_problems, failure_problems, tier_problems
from ftrain.experiments.experiment_config import Kill
from ftrain.experiments.goodput_check import attempt_resumes, check_goodput, disagreements
from ftrain.experiments.readings import PhaseInput
from ftrain.experiments.results import ExperimentResult, Failure, Overhead, PhaseResult, Stall
from ftrain.train.metrics import Record, segments

FINAL_LINE: Final = re.compile(r"^FINAL step=(\d+) params_sha256=([0-9a-f]{64})", re.MULTILINE)


def _unix(moment: datetime) -> float:
    return moment.timestamp()


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _done_at(segment: Sequence[Record], step: int) -> float | None:
    """When the attempt had `step` done (its save included): the last line at or before it; for an attempt
    that resumed from `step`, when its first step began."""
    done = [r.time for r in segment if r.iter is not None and r.iter <= step]
    if done:
        return max(done)
    first = next((r for r in segment if r.is_step and r.iter == step + 1), None)
    return None if first is None or first.dt is None else first.time - first.dt


def stall(records: Sequence[Record]) -> Stall:
    """Per-save stall medians (sync save; async stage, drain, and their sum), the memory snapshots' median,
    and the total stall (snapshots' included)."""
    saves = [r for r in records if r.is_save]
    snapshots = [r.stall for r in records if r.is_snapshot]
    final = sum(r.drain_seconds or 0.0 for r in records if r.final)

    def median_of(values: list[float | None]) -> float | None:
        return _median([v for v in values if v is not None])

    return Stall(
        saves=len(saves),
        median_save=median_of([r.save_seconds for r in saves]),
        median_stage=median_of([r.stage_seconds for r in saves]),
        median_drain=median_of([r.drain_seconds for r in saves]),
        median_total=_median([r.stall for r in saves]),
        total=sum(r.stall for r in saves) + sum(snapshots) + final,
        snapshots=len(snapshots),
        median_snapshot=_median(snapshots),
    )


def _widest(records: Sequence[Record], copies: Sequence[Checkpointed | Snapshotted], save: bool) -> int:
    """The most steps trained between a copy's line (its save's, or its step's when `save` is False) and
    its event, within the attempt that took it."""
    widest = 0
    for event in copies:
        sealed = _unix(event.time)
        start = max(
            (
                i
                for i, r in enumerate(records)
                if (r.is_save if save else r.is_step) and r.iter == event.step and r.time <= sealed
            ),
            default=None,
        )
        if start is None:
            continue
        reached = event.step
        for record in records[start + 1 :]:
            if record.time > sealed or record.restart_seconds is not None:
                break
            reached = max(reached, record.iter or reached)
        widest = max(widest, reached - event.step)
    return widest


def copy_window(records: Sequence[Record], events: Sequence[AnyEvent]) -> int:
    """The most steps trained between a save's line and its `checkpointed` event, or the failure that cut it
    short (async saves complete in the background; a sync save is complete before its line is written, so
    0)."""
    saves = [e for e in events if isinstance(e, Checkpointed)]
    return max(_widest(records, saves, save=True), _cut_short_window(records, events))


def snapshot_window(records: Sequence[Record], events: Sequence[AnyEvent]) -> int:
    """The most steps trained between a memory snapshot's step and its `snapshotted` event: the snapshot is
    written, verified and recorded behind the loop, so a kill meanwhile finds the one before it newest."""
    return _widest(records, [e for e in events if isinstance(e, Snapshotted)], save=False)


def _cut_short_window(records: Sequence[Record], events: Sequence[AnyEvent]) -> int:
    """The most steps an attempt trained past the save it was still making when it died (no `checkpointed`
    for that step before the next attempt's first step): a kill inside an async save loses those too."""
    sealed = [(e.step, _unix(e.time)) for e in events if isinstance(e, Checkpointed)]
    attempts = segments(records)
    widest = 0
    for attempt, following in pairwise(attempts):
        saves = [(r.iter, r.time) for r in attempt if r.is_save and r.iter is not None]
        if not saves or not following:
            continue
        (saved, at), until = saves[-1], following[0].time
        if any(step == saved and at <= when <= until for step, when in sealed):
            continue
        reached = max((r.iter for r in attempt if r.is_step and r.iter is not None), default=saved)
        widest = max(widest, reached - saved)
    return widest


def analyze_phase(data: PhaseInput) -> PhaseResult:
    """One phase: failures paired in order (kill i ↔ `failed` i ↔ `resumed` i ↔ restart line i), checked."""
    events = data.events
    launched = next((e for e in events if isinstance(e, Launched)), None)
    completed = next((e for e in events if isinstance(e, Completed)), None)
    failed = [e for e in events if isinstance(e, Failed)]
    resumed = [r.effective for r in attempt_resumes(events)]
    records = data.records
    steps = [r for r in records if r.is_step]
    start = steps[0].time - (steps[0].dt or 0.0) if steps else None
    origin = start if start is not None else (_unix(launched.time) if launched else 0.0)
    parts = segments(records)
    restarts = [part[0] for part in parts[1:]]
    problems = [f"event log: {finding}" for finding in data.findings]
    problems += count_problems(data, failed, resumed, restarts)

    final = FINAL_LINE.findall(data.stdout or "")
    window = copy_window(records, events) if data.async_ckpt else 0
    snapshots = snapshot_window(records, events) if data.memory_every is not None else 0
    bound = (
        LostBound(data.save_interval, window)
        if data.memory_every is None
        else LostBound(data.memory_every, snapshots, ("memory_every", "snapshot window"))
    )
    failures = []
    for i, (fail, resume) in enumerate(zip(failed, resumed, strict=False)):
        kill = data.kills[i] if data.kills is not None and i < len(data.kills) else None
        restart = restarts[i] if i < len(restarts) else None
        newest = _newest_complete(kill, data.set_aside, events, resume) if kill else None
        failure = _failure(i + 1, fail, resume, kill, newest, restart, parts[i] if restart else [], origin)
        problems += failure_problems(failure, restart, kill is not None, bound)
        failures.append(failure)
    goodput = check_goodput(events, records)
    if data.memory_every is not None:
        problems += tier_problems(failures, goodput.log if goodput else None)
    if completed is None:
        problems.append("the run did not complete (no `completed` event)")
    if data.stdout is not None and not final:
        problems.append("no `FINAL step=… params_sha256=…` line in the supervisor's output")
    problems += disagreements(goodput) if goodput else []
    return PhaseResult(
        phase=data.phase,
        run_id=data.run_id,
        async_ckpt=data.async_ckpt,
        save_interval=data.save_interval,
        completed=completed is not None,
        wall_seconds=records[-1].time - start if completed and start is not None else None,
        launch_to_completed=_unix(completed.time) - _unix(launched.time) if completed and launched else None,
        final_step=int(final[-1][0]) if final else (steps[-1].iter if steps else None),
        digest=final[-1][1] if final else None,
        failures=failures,
        stall=stall(records),
        step_seconds=_median([r.dt for r in steps if r.dt is not None]),
        steps_total=sum(r.dt or 0.0 for r in steps) - sum(_thrown_away(parts, failures)),
        copy_window_steps=window,
        memory_every=data.memory_every,
        snapshot_window_steps=snapshots,
        curve=[(r.time - origin, r.iter) for r in steps if r.iter is not None],
        problems=problems,
        goodput=goodput,
    )


def _newest_complete(
    kill: Kill, set_aside: Sequence[int], events: Sequence[AnyEvent], resume: Resumed
) -> int | None:
    """Where the resume after `kill` must start: the newest checkpoint complete at it and not set aside,
    or, if newer, the newest memory snapshot every rank had sealed at it and the log recorded before the
    resume (a trainer tries only a snapshot the log vouches for)."""
    durable = max((s for s in kill.complete_steps if s not in set_aside), default=None)
    before = next((i for i, e in enumerate(events) if e is resume), len(events))
    logged = {e.step for e in events[:before] if isinstance(e, Snapshotted)}
    snapshot = next((s for s in kill.snapshot_steps if s in logged), None)
    return max((s for s in (durable, snapshot) if s is not None), default=None)


def _failure(
    index: int,
    fail: Failed,
    resume: Resumed,
    kill: Kill | None,
    newest_complete: int | None,
    restart: Record | None,
    killed: Sequence[Record],
    origin: float,
) -> Failure:
    """One failure's figures: `killed` is the attempt it ended (rank 0's lines), `restart` the first line
    after its resume. Without the driver's kill record, the `failed` event's time stands for the kill."""
    kill_time = kill.time if kill else _unix(fail.time)
    done = _done_at(killed, resume.step)
    return Failure(
        index=index,
        trigger=kill.trigger if kill else f"failed: {fail.reason} ({fail.message})",
        kill_at=kill_time - origin,
        newest_complete=newest_complete,
        resume_step=resume.step,
        reached_step=max((r.iter for r in killed if r.iter is not None), default=None),
        lost_steps=restart.lost_steps if restart else None,
        restart_seconds=restart.restart_seconds if restart else None,
        first_step_seconds=restart.dt if restart else None,
        resumed_at=restart.time - origin if restart else None,
        relaunch_seconds=(
            restart.time - restart.restart_seconds - kill_time
            if restart and restart.restart_seconds is not None
            else None
        ),
        recompute_seconds=kill_time - done if done is not None else None,
        tier=resume.tier if isinstance(resume.tier, str) else "durable",
    )


def _thrown_away(parts: Sequence[Sequence[Record]], failures: Sequence[Failure]) -> list[float]:
    """`train/dt` of the steps each failure threw away: its killed attempt's steps past the resume point."""
    return [
        r.dt or 0.0
        for f in failures
        if f.resumed_at is not None and f.index - 1 < len(parts)
        for r in parts[f.index - 1]
        if r.is_step and (r.iter or 0) > f.resume_step
    ]


def overhead(phase: PhaseResult, baseline: PhaseResult) -> Overhead | None:
    """The phase's extra wall-clock over the baseline and its parts (None without both wall-clocks)."""
    if phase.wall_seconds is None or baseline.wall_seconds is None:
        return None
    f = phase.failures
    return Overhead(
        phase=phase.phase,
        failures=len(f),
        overhead=phase.wall_seconds - baseline.wall_seconds,
        relaunch=sum(x.relaunch_seconds or 0.0 for x in f),
        restart=sum((x.restart_seconds or 0.0) - (x.first_step_seconds or 0.0) for x in f),
        recompute=sum(x.recompute_seconds or 0.0 for x in f),
        stall_delta=phase.stall.total - baseline.stall.total,
        step_delta=phase.steps_total - baseline.steps_total,
    )


def analyze(title: str, notes: list[str], inputs: Sequence[PhaseInput]) -> ExperimentResult:
    """Every phase (the first is the baseline), the overheads over it, and the digest comparison."""
    phases = [analyze_phase(data) for data in inputs]
    baseline = phases[0]
    overheads = [o for p in phases[1:] if (o := overhead(p, baseline)) is not None]
    problems = [f"{p.phase}: {problem}" for p in phases for problem in p.problems]
    problems += [
        f"{p.phase}: final params_sha256 {p.digest} differs from the baseline's {baseline.digest}"
        for p in phases[1:]
        if p.digest and baseline.digest and p.digest != baseline.digest
    ]
    return ExperimentResult(title=title, notes=notes, phases=phases, overheads=overheads, problems=problems)
