"""The restart-cost experiment's memory phase, pure: the same kills with the memory tier on, each resume
loaded from node memory and checked to be, its lost steps bounded by `memory_every` and the snapshot window,
its goodput from the log equal to its metrics', and the report showing it beside the other phases."""

import msgspec

from ftrain.events.schema import AnyEvent, Snapshotted
from ftrain.experiments.analysis import analyze, analyze_phase
from ftrain.experiments.checks import LostBound, failure_problems
from ftrain.experiments.experiment_config import (
    PHASE_KINDS,
    PHASES,
    ExperimentConfig,
    Kill,
    parse_injection,
)
from ftrain.experiments.goodput_check import attempt_resumes
from ftrain.experiments.readings import PhaseInput
from ftrain.experiments.report import markdown, side_by_side, stall_line
from ftrain.experiments.schedule import KillSchedule
from ftrain.train.metrics import Record, decode_record, loop_times
from tests.unit.test_restart_analysis import (
    COMPLETED,
    DIGEST,
    RUN,
    T0,
    at,
    baseline_phase,
    phase,
    resumed,
    saved,
    steps,
)


def snapshotted(step: int, seconds: float, train: float) -> AnyEvent:
    return at(Snapshotted(run_id=RUN, step=step, epoch=0, shards=2, uri=f"file:///dev/shm/step-{step}",
                          checkpoint_hash=f"{step:064x}", size_bytes=1, attempt=1, train_seconds=train), seconds)  # fmt: skip


def snapshot_line(step: int) -> Record:
    """The line a snapshot staged after step `step` writes: 0.1 s after the step's, holding the loop 0.1 s."""
    return Record(time=T0 + step - 1 + 0.1, iter=step, memory_stage_seconds=0.1)


def memory_phase(*, tier: str | None = "memory", snapshot_24_at: int = 4) -> PhaseInput:
    """`phase()`'s job with a snapshot every 2 steps: attempt 1 snapshots steps 22 and 24 (their stage lines
    0.1 s after their steps'), is killed at 25.5 s after step 25, and its successor, opened from the durable
    step 20, resumes from memory at step 24 (1 step lost, 0.9 s of loop). Productive: 23.0 s of attempt 1
    (19.3 to step 20, then 0.8 + 1.0 + 0.9 + 1.0), 5.5 s of attempt 2. `snapshot_24_at`: where the event of
    snapshot 24 stands among the events (after the resume: recorded too late for it)."""
    base = phase()
    restart = Record(time=T0 + 35, iter=25, loss=1.0, dt=0.5, restart_seconds=5.0, lost_steps=1)
    killed = sorted([*steps(1, 25, 0), snapshot_line(22), snapshot_line(24)], key=lambda r: r.time)
    opening = msgspec.structs.replace(resumed(20), attempt=2)
    from_memory = msgspec.structs.replace(resumed(24), attempt=2, tier=tier or msgspec.UNSET)
    events = [
        at(base.events[0], -5),
        base.events[1],
        base.events[2],
        snapshotted(22, 21.5, 21.1),
        at(base.events[3], 27),
        at(opening, 33),
        at(from_memory, 33.5),
        saved(30, 40.2, 5.5, 34.5, lost_steps=1, lost_seconds=0.9),
        at(COMPLETED, 42),
    ]
    events.insert(snapshot_24_at, snapshotted(24, 23.5, 23.0))
    return msgspec.structs.replace(
        base,
        phase="memory",
        events=events,
        records=[*killed, restart, *steps(26, 30, 36)],
        stdout=(
            "Attempt 1 of 3 failed (killed by SIGKILL) after 27.0 s — checkpoint step 20; retrying in 0 s\n"
            f"RESUMED from step=24 (epoch=0), from memory\nFINAL step=30 params_sha256={DIGEST}\n"
        ),
        kills=[
            Kill(
                phase="memory",
                time=T0 + 25.5,
                by="driver",
                trigger="memory snapshot 24 complete (gate 20)",
                complete_steps=(20, 10),
                snapshot_steps=(24, 22),
            )
        ],
        memory_every=2,
    )


def test_a_memory_phase_resumes_from_the_snapshot_newest_at_the_kill_and_its_goodput_agrees() -> None:
    result = analyze_phase(memory_phase())
    assert result.problems == []
    (failure,) = result.failures
    assert (failure.newest_complete, failure.resume_step, failure.lost_steps, failure.tier) == (
        24,
        24,
        1,
        "memory",
    )
    assert (result.kind, result.lost_bound, result.snapshot_window_steps) == ("sync + memory every 2", 2, 0)
    assert (result.stall.snapshots, result.stall.median_snapshot) == (2, 0.1)
    assert result.goodput is not None and result.goodput.measured is not None
    log, metrics = result.goodput.log, result.goodput.measured
    assert (log.productive, metrics.productive) == (23.0 + 5.5, 23.0 + 5.5)
    assert (log.recomputed, metrics.recomputed) == (0.9, 0.9)
    assert log.lost_by_tier == {"memory": 1}


def test_a_resume_the_memory_tier_did_not_serve_fails_the_phase() -> None:
    durable = analyze_phase(memory_phase(tier=None))
    assert "failure 1: resumed from the durable tier, not from memory" in durable.problems
    assert "goodput: lost steps counted under tiers other than memory: {'durable': 1}" in durable.problems


def test_a_snapshot_the_log_recorded_only_after_the_resume_was_not_the_resumes_to_load() -> None:
    late = analyze_phase(memory_phase(snapshot_24_at=7))
    assert late.failures[0].newest_complete == 22
    assert late.problems[0] == (
        "failure 1: resumed from step 24, but the newest complete checkpoint at the kill was 22"
    )


def test_lost_steps_beyond_memory_every_and_the_snapshot_window_are_reported() -> None:
    failure = analyze_phase(memory_phase()).failures[0]
    bound = LostBound(2, 1, ("memory_every", "snapshot window"))
    assert failure_problems(msgspec.structs.replace(failure, lost_steps=3), None, True, bound) == []
    assert failure_problems(msgspec.structs.replace(failure, lost_steps=4), None, True, bound) == [
        "failure 1: lost 4 steps, more than memory_every 2 + snapshot window 1"
    ]


def test_each_attempt_trains_from_its_last_resume_and_restarts_from_its_first() -> None:
    events = memory_phase().events
    (one,) = attempt_resumes(events)
    assert (one.opening.step, one.effective.step, one.effective.tier) == (20, 24, "memory")
    assert [r.effective.step for r in attempt_resumes(phase().events)] == [20]


def test_the_report_shows_the_memory_phase_beside_the_others() -> None:
    result = analyze("t", [], [baseline_phase(), phase(), memory_phase()])
    assert result.problems == [] and result.digests_equal
    memory = result.phases[2]
    assert side_by_side(memory) == (
        "memory", "sync + memory every 2", "1", "memory 1", "1", "≤ 2", "memory 1", "5.00", "60.6 %",
    )  # fmt: skip
    assert side_by_side(result.phases[1])[3:7] == ("durable 1", "5", "≤ 10", "durable 5")
    assert stall_line(memory) == "0.200 s (n=3); memory snapshot 0.100 s (n=2)"
    text = markdown(result)
    assert (
        "| 1 | memory snapshot 24 complete (gate 20) | 26.0 | 24 | 24 | 1 | 5.00 | 4.50 | 2.40 | memory |"
        in text
    )
    assert "memory_every 2 + the snapshot window (0 steps" in text
    assert text.index("## Failures side by side") < text.index("## Failures\n")


def test_phases_are_one_table_and_an_older_experiment_reads_with_the_phases_it_ran() -> None:
    assert PHASES == ("baseline", "sync", "async", "memory")
    assert [k.failures for k in PHASE_KINDS.values()] == [False, True, True, True]
    assert [p for p, k in PHASE_KINDS.items() if k.memory_tier] == ["memory"]
    old = msgspec.json.encode(
        {"preset": "quick", "model": "debug", "train_iters": 300, "save_interval": 10, "nproc": 2, "seed": 0,
         "backoff": 0.0, "max_retries": 5, "injection": {"kind": "steps", "steps": [60]}, "log": "embedded",
         "run_ids": {"baseline": "b", "sync": "s", "async": "a"}, "started": "x"}
    )  # fmt: skip
    config = msgspec.json.decode(old, type=ExperimentConfig)
    assert (config.phases, config.memory_every) == (["baseline", "sync", "async"], None)
    kill = msgspec.json.decode(
        b'{"phase":"sync","time":1.0,"by":"driver","trigger":"t","complete_steps":[60]}', type=Kill
    )
    assert kill.snapshot_steps == ()


def test_the_memory_phases_kill_names_the_snapshot_it_waited_for() -> None:
    schedule = KillSchedule(parse_injection("steps:60"), train_iters=300, copy="memory snapshot")
    assert schedule.due(0, 58) is None
    assert schedule.due(1, 62) == "memory snapshot 62 complete (gate 60)"


def test_a_snapshots_stage_is_a_stall_between_steps_not_training() -> None:
    line = decode_record(b'{"time": 3.1, "train/iter": 2, "train/memory_stage_seconds": 0.25}')
    assert line is not None and line.is_snapshot and not line.is_save and not line.is_step
    records = [Record(time=1.0, iter=1, dt=0.5), Record(time=2.0, iter=2, dt=0.9), line,
               Record(time=4.0, iter=3, dt=0.6)]  # fmt: skip
    assert loop_times(records) == [(1, 0.5), (2, 1.0), (3, 2.0 - 0.25)]
