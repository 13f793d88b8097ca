"""The restart-cost experiment's pure parts: injection specs, the kill schedule, and the analysis, which must
report every disagreement between the log, the metrics, the supervisor's output and the kill records."""

import os
import stat
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest

from ftrain.events.schema import AnyEvent, Checkpointed, Completed, Failed, Resumed
from ftrain.experiments.analysis import analyze, analyze_phase
from ftrain.experiments.experiment_config import Kill, parse_injection
from ftrain.experiments.readings import PhaseInput
from ftrain.experiments.report import markdown
from ftrain.experiments.schedule import KillSchedule
from ftrain.train.metrics import Record
from tests.support.builders import checkpointed, launched

T0 = 1_800_000_000.0
RUN = "r"
DIGEST = "ab" * 32


def at(event: AnyEvent, seconds: float) -> AnyEvent:
    """`event`, stamped `seconds` after T0."""
    return msgspec.structs.replace(event, time=datetime.fromtimestamp(T0 + seconds, UTC))


def resumed(step: int) -> Resumed:
    return Resumed(
        run_id=RUN, checkpoint_seq=3, step=step, epoch=0, uri="", checkpoint_hash="", resume_count=1
    )


def steps(first: int, last: int, start: float) -> list[Record]:
    """One step a second from `start` (0.5 s each), with a save line after every tenth."""
    out = []
    for i, step in enumerate(range(first, last + 1)):
        out.append(Record(time=T0 + start + i, iter=step, loss=1.0, dt=0.5))
        if step % 10 == 0:
            out.append(Record(time=T0 + start + i + 0.2, iter=step, save_seconds=0.2))
    return out


def saved(step: int, seconds: float, train: float, loop_start: float, **lost: int) -> AnyEvent:
    """`checkpointed` at `seconds`, as the trainer reports it: 0.2 s stall, `train` seconds of steps, its loop
    started at `loop_start`."""
    measured = {"stall_seconds": 0.2, "train_seconds": train, "loop_seconds": seconds - loop_start, **lost}
    return at(msgspec.structs.replace(checkpointed(RUN, step), **measured), seconds)


COMPLETED = Completed(run_id=RUN, cost_gpu_hours=0.0, running_seconds=50, cost_source="wall-time")


def phase(
    *, resume_step: int = 20, complete: tuple[int, ...] = (20, 10), stdout_step: int = 20
) -> PhaseInput:
    """Killed at 25.5 s after step 25, resumed from step 20 (5 steps lost), first step after it at 35 s. The
    trainer's goodput fields agree with its metrics: a step a second (0.5 s of it `train/dt`), its loops start at
    -0.5 s and 34.5 s, each save starts at its step's line and holds the loop 0.2 s."""
    restart = Record(time=T0 + 35, iter=resume_step + 1, loss=1.0, dt=0.5, restart_seconds=5.0, lost_steps=5)
    events = [
        at(launched(RUN), -5),
        saved(10, 9.2, 9.5, -0.5),
        saved(20, 19.2, 19.3, -0.5),
        at(Failed(run_id=RUN, reason="signal", exit_code=137), 27),
        at(resumed(resume_step), 33),
        saved(30, 44.2, 9.5, 34.5, lost_steps=5),
        at(COMPLETED, 46),
    ]
    return PhaseInput(
        phase="sync",
        run_id=RUN,
        async_ckpt=False,
        save_interval=10,
        events=events,
        findings=[],
        records=[*steps(1, 25, 0), restart, *steps(resume_step + 2, 30, 36)],
        stdout=(
            "Attempt 1 of 3 failed (killed by SIGKILL) after 27.0 s — checkpoint step 20; retrying in 0 s\n"
            f"RESUMED from step={stdout_step} (epoch=0)\nFINAL step=30 params_sha256={DIGEST}\n"
        ),
        kills=[Kill(phase="sync", time=T0 + 25.5, by="driver", trigger="t", complete_steps=complete)],
        set_aside=[],
    )


def test_a_consistent_phase_splits_its_failure_into_relaunch_restart_and_recompute() -> None:
    result = analyze_phase(phase())
    assert result.problems == []
    (failure,) = result.failures
    assert (failure.newest_complete, failure.resume_step, failure.lost_steps) == (20, 20, 5)
    assert failure.restart_seconds == 5.0
    assert failure.relaunch_seconds == pytest.approx(35 - 5 - 25.5)  # kill → the new process's start
    assert failure.recompute_seconds == pytest.approx(25.5 - 19.2)  # past step 20's save, lost
    assert result.digest == DIGEST and result.completed
    assert result.wall_seconds == pytest.approx(T0 + 44.2 - (T0 - 0.5))  # first step's start → last save
    assert (result.stall.saves, result.stall.median_save) == (3, 0.2)


def test_every_disagreement_is_reported() -> None:
    older = analyze_phase(phase(complete=(30, 20, 10)))  # step 30 was complete at the kill, yet resumed 20
    assert older.problems == [
        "failure 1: resumed from step 20, but the newest complete checkpoint at the kill was 30"
    ]
    lines = analyze_phase(phase(stdout_step=10))
    assert lines.problems == ["`resumed` events from steps [20] but `RESUMED from step=` lines say [10]"]
    data = phase()
    no_restart_line = msgspec.structs.replace(
        data, records=[r for r in data.records if r.restart_seconds is None]
    )
    assert (
        "1 `resumed` event(s) with steps left to train but 0 `train/restart_seconds` line(s) in the metrics"
        in (analyze_phase(no_restart_line).problems)
    )
    two_kills = msgspec.structs.replace(data, kills=[*(data.kills or []), *(data.kills or [])])
    assert analyze_phase(two_kills).problems == ["2 kill(s) but 1 `failed` and 1 `resumed` event(s)"]
    set_aside = msgspec.structs.replace(phase(complete=(30, 20, 10)), set_aside=[30])
    assert analyze_phase(set_aside).problems == []  # 30 was sealed but never recorded: resuming 20 is right


def test_a_resume_at_the_last_step_trains_nothing_and_owes_no_restart_line() -> None:
    """An attempt that sealed its last step and then died (at exit) is relaunched, resumes there and ends at
    once: no step, so no `train/restart_seconds` line, and no mismatch for it."""
    data = phase(resume_step=30, complete=(30, 20, 10), stdout_step=30)
    assert analyze_phase(msgspec.structs.replace(data, records=steps(1, 30, 0))).problems == []


def test_steps_trained_past_an_async_save_the_kill_cut_short_widen_the_copy_window() -> None:
    """Killed after step 25 while step 20's async save was still in flight (its line written, never sealed):
    the resume from 10 loses 15 steps, the interval plus the 5 trained during that save, and that is no
    mismatch. With step 20 sealed, the window is that of the completed saves (0 here)."""
    data = phase(resume_step=10, complete=(10,), stdout_step=10)
    assert analyze_phase(msgspec.structs.replace(data, async_ckpt=True)).copy_window_steps == 0
    events = [e for e in data.events if not (isinstance(e, Checkpointed) and e.step == 20)]
    cut = msgspec.structs.replace(data, async_ckpt=True, events=events)
    assert analyze_phase(cut).copy_window_steps == 5


def baseline_phase() -> PhaseInput:
    """`phase()`'s job without the failure: steps 1-30, saves at 10, 20, 30."""
    base = phase()
    return msgspec.structs.replace(
        base,
        phase="baseline",
        events=[*base.events[:3], saved(30, 29.2, 29.1, -0.5), at(COMPLETED, 31)],
        records=steps(1, 30, 0),
        kills=[],
        stdout=f"FINAL step=30 params_sha256={DIGEST}\n",
    )


def test_the_overhead_over_the_baseline_and_the_report() -> None:
    baseline = baseline_phase()
    result = analyze("t", ["a note"], [baseline, phase()])
    (over,) = result.overheads
    assert over.overhead == pytest.approx(44.2 - 29.2)
    parts = (over.relaunch, over.restart, over.recompute, over.stall_delta, over.step_delta)
    assert parts == pytest.approx(
        (4.5, 5.0 - 0.5, 6.3, 0.0, 0.0)
    )  # the redone steps 21-25 are not counted twice
    assert over.residual == pytest.approx(15.0 - 15.3)
    assert result.digests_equal and result.problems == []
    text = markdown(result)
    # the kill at 26.0 s counts from the start of the first step (at -0.5 s)
    assert "| 1 | t | 26.0 | 20 | 20 | 5 | 5.00 | 4.50 | 6.30 | durable |" in text.splitlines()
    assert "No mismatch." in text and "MISMATCH" not in text
    broken = analyze("t", [], [baseline, phase(stdout_step=10)])
    assert "- MISMATCH sync: `resumed` events from steps [20]" in markdown(broken)


def test_the_goodput_from_the_log_alone_equals_the_metrics_within_rounding() -> None:
    result = analyze_phase(phase())
    assert result.goodput is not None and result.goodput.measured is not None
    log, metrics = result.goodput.log, result.goodput.measured
    # wall -5 → 46; productive: -0.5 → 19 less a stall, 34.5 → 44; three 0.2 s stalls; start-up -5 → -0.5;
    # restart 33 → 34.5; down: failed at 27 → resumed at 33; recomputed: steps 21-25 of the killed attempt,
    # 4.8 s (19 → 24 less a stall), which the log estimates at 5 × 19.3 / 20
    expected = (51.0, 19.3 + 9.5, 0.6, 4.5, 1.5, 5)
    assert (log.wall, log.productive, log.checkpoint_stall, log.startup, log.restart,
            log.lost_steps) == pytest.approx(expected)  # fmt: skip
    assert (metrics.wall, metrics.productive, metrics.checkpoint_stall, metrics.startup, metrics.restart,
            metrics.lost_steps) == pytest.approx(expected)  # fmt: skip
    assert (log.recomputed, metrics.recomputed) == pytest.approx((5 * 19.3 / 20, 4.8))
    assert (log.down, log.other) == pytest.approx((6.0, 51.0 - 28.8 - 0.6 - 4.5 - 1.5 - 6.0 - 4.825))
    row = "| sync | 56.5 % / 56.5 % | 28.8 / 28.8 | 0.6 / 0.6 | 4.5 / 4.5 | 1.5 / 1.5 | 4.8 / 4.8 | 5 / 5 | 6.0 | 4.8 | 51.0 |"
    assert row in markdown(analyze("t", [], [phase()])).splitlines()


def with_event(data: PhaseInput, index: int, **changes: object) -> PhaseInput:
    events = list(data.events)
    events[index] = msgspec.structs.replace(events[index], **changes)
    return msgspec.structs.replace(data, events=events)


def test_every_goodput_difference_beyond_rounding_is_reported() -> None:
    data = phase()
    assert analyze_phase(with_event(data, 1, stall_seconds=0.3)).problems == []  # 0.1 s off: within rounding
    assert analyze_phase(with_event(data, 1, stall_seconds=0.31)).problems == [
        "goodput: checkpoint_stall 0.71 s from the log, 0.60 s from the metrics"
    ]
    assert analyze_phase(with_event(data, 5, loop_seconds=msgspec.UNSET)).problems == [
        "goodput: restart is unknown from the log"
    ]
    # recomputed is an estimate: within half the measured 4.8 s (7 × 0.965 s), not beyond (8 × 0.965 s)
    assert analyze_phase(with_event(data, 5, lost_steps=7)).problems == [
        "goodput: 7 lost steps in the log, 5 in the metrics"
    ]
    assert analyze_phase(with_event(data, 5, lost_steps=8)).problems == [
        "goodput: recomputed 7.72 s from the log, 4.80 s from the metrics",
        "goodput: 8 lost steps in the log, 5 in the metrics",
    ]
    assert analyze_phase(with_event(data, 5, train_seconds=9.6)).problems == []
    assert analyze_phase(with_event(data, 5, train_seconds=9.61)).problems == [
        "goodput: productive 28.91 s from the log, 28.80 s from the metrics"
    ]
    no_first_step = msgspec.structs.replace(data, records=[r for r in data.records if r.iter != 1])
    assert analyze_phase(no_first_step).problems == [
        "goodput: productive 28.80 s from the log, 27.80 s from the metrics",
        "goodput: startup 4.50 s from the log, 5.50 s from the metrics",
    ]


def test_lost_steps_the_trainer_timed_must_equal_the_metrics_within_rounding_not_half() -> None:
    timed = with_event(phase(), 5, lost_seconds=4.8)  # what the resumed trainer read from the metrics
    result = analyze_phase(timed)
    assert result.problems == [] and result.goodput is not None
    assert (result.goodput.log.recomputed, result.goodput.log.recomputed_estimated) == (4.8, False)
    assert analyze_phase(with_event(phase(), 5, lost_seconds=4.89)).problems == []
    assert analyze_phase(with_event(phase(), 5, lost_seconds=5.0)).problems == [
        "goodput: recomputed 5.00 s from the log, 4.80 s from the metrics"  # an estimate this near would pass
    ]


def test_a_log_from_before_the_goodput_fields_is_shown_not_checked() -> None:
    data = phase()
    fields = {"stall_seconds": msgspec.UNSET, "train_seconds": msgspec.UNSET, "loop_seconds": msgspec.UNSET,
              "lost_steps": msgspec.UNSET}  # fmt: skip
    old = msgspec.structs.replace(
        data,
        events=[
            msgspec.structs.replace(e, **fields) if isinstance(e, Checkpointed) else e for e in data.events
        ],
    )
    result = analyze_phase(old)
    assert result.problems == [] and result.goodput is not None and result.goodput.measured is None
    assert result.goodput.log.ratio is None
    assert (
        "| sync | — / — | — / — | — / — | — / — | — / — | — / — | — / — | 6.0 | 45.0 | 51.0 |"
        in markdown(analyze("t", [], [old])).splitlines()
    )


def test_injection_specs() -> None:
    assert parse_injection("time:90").kills == 3
    assert parse_injection("time:5:2").every_seconds == 5.0
    assert parse_injection("steps:60:120:180").steps == (60, 120, 180)
    save = parse_injection("save:fanout:40:80")
    assert save.kill_at(async_ckpt=True) == "fanout:40,fanout:80"
    assert save.kill_at(async_ckpt=False) == "write:40,write:80"  # a sync save has no fan-out
    assert parse_injection("steps:60").kill_at(async_ckpt=True) is None
    # a memory snapshot's points are no save's: refused in one line, not a KeyError in the sync phases
    for bad in (
        "steps:60:50",
        "save:step:10",
        "save:snapshot:10",
        "save:write",
        "bogus",
        "time:0",
        "steps:x",
    ):
        with pytest.raises(ValueError, match="--inject"):
            parse_injection(bad)


def test_step_gated_kills_wait_for_each_gate_and_for_progress() -> None:
    schedule = KillSchedule(parse_injection("steps:30:50"), train_iters=100)
    assert schedule.due(0, None) is None and schedule.due(1, 20) is None
    assert schedule.due(2, 30) == "checkpoint 30 complete (gate 30)"
    schedule.fired_at(30)
    assert schedule.due(3, 30) is None and schedule.due(4, 40) is None
    assert schedule.due(5, 60) is not None
    schedule.fired_at(60)
    assert schedule.due(6, 90) is None  # every kill delivered


def test_time_based_kills_count_from_the_first_checkpoint_and_never_hit_a_stalled_or_finished_job() -> None:
    schedule = KillSchedule(parse_injection("time:5"), train_iters=100)
    assert schedule.due(100, None) is None
    assert schedule.due(101, 10) is None  # the clock starts at the first complete checkpoint
    assert schedule.due(106, 20) == "5.0 s after the first complete checkpoint (every 5 s)"
    schedule.fired_at(20)
    assert schedule.due(112, 20) is None  # due, but no checkpoint since the last kill
    assert schedule.due(112, 30) is not None
    schedule.fired_at(30)
    assert schedule.due(200, 100) is None  # the last step is checkpointed: nothing left to lose


def test_the_plot_and_the_report_are_private_to_their_user_whatever_the_umask(tmp_path: Path) -> None:
    from ftrain.experiments.plot import publish

    old = os.umask(0o022)
    try:
        plot, report = publish(analyze("t", [], [phase()]), tmp_path / "experiments" / "restart-1")
    finally:
        os.umask(old)
    modes = {
        p: stat.S_IMODE(os.stat(p).st_mode) for p in (tmp_path / "experiments", plot.parent, plot, report)
    }
    assert modes == {tmp_path / "experiments": 0o700, plot.parent: 0o700, plot: 0o600, report: 0o600}
    assert plot.read_bytes().startswith(b"\x89PNG") and "## Summary" in report.read_text()
