"""Goodput from a run's events alone (`projections.goodput`): every term, its boundaries, and old logs.

Each scenario is a legal chain (every event passes the lifecycle's judge), stamped in seconds after T0. The
timelines are built so that each term is known exactly: a trainer that starts its loop at `loop_start`,
takes 0.6 s a step and stalls 1 s a save, reports at each save what `ftrain.train.attempt_clock` would.
"""

from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from msgspec import UNSET

from ftrain.cli.goodput_view import by_tier
from ftrain.domain.lifecycle import RunState, apply
from ftrain.events.chain import ChainHead
from ftrain.events.schema import (
    AnyEvent,
    Checkpointed,
    Completed,
    CorruptSkipped,
    Failed,
    Resumed,
    Snapshotted,
)
from ftrain.projections.goodput import Goodput, measure
from tests.support.builders import launched

RUN = "r"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class Log:
    """A run's events, each judged legal as it is added, stamped `seconds` after T0."""

    def __init__(self) -> None:
        self.events: list[AnyEvent] = []
        self.state: RunState | None = None
        self.add(launched(RUN), 0)

    def add(self, event: AnyEvent, seconds: float) -> AnyEvent:
        seq = len(self.events) + 1
        stamped = msgspec.structs.replace(event, seq=seq, time=at(seconds))
        self.state = apply(self.state, stamped, ChainHead(seq, f"{seq:064x}", seq))
        self.events.append(stamped)
        return stamped

    def save(self, step: int, seconds: float, attempt: int = 1, **measured: float) -> Checkpointed:
        event = Checkpointed(run_id=RUN, step=step, epoch=0, shards=1, uri=f"file:///c/{RUN}/step-{step}",
                             checkpoint_hash=f"{step:064x}", size_bytes=1, attempt=attempt, **measured)  # fmt: skip
        added = self.add(event, seconds)
        assert isinstance(added, Checkpointed)
        return added

    def fail(self, seconds: float, attempt: int = 1) -> None:
        self.add(Failed(run_id=RUN, reason="preempted", attempt=attempt), seconds)

    def resume(self, ref: Checkpointed | None, seconds: float, attempt: int, count: int) -> None:
        self.add(
            Resumed(run_id=RUN, checkpoint_seq=ref.seq if ref else 0, step=ref.step if ref else 0, epoch=0,
                    uri=ref.uri if ref else "", checkpoint_hash=ref.checkpoint_hash if ref else "",
                    resume_count=count, attempt=attempt, forced=self.state is not None and self.state.status == "running"),
            seconds,
        )  # fmt: skip

    def complete(self, seconds: float, attempt: int = 1) -> None:
        self.add(Completed(run_id=RUN, cost_gpu_hours=1, running_seconds=1, cost_source="reported", attempt=attempt),
                 seconds)  # fmt: skip

    def measure(self, now: float = 1000.0) -> Goodput:
        return measure(self.events, at(now))


def first_attempt(log: Log) -> Checkpointed:
    """Loop starts at 5 s; saves at steps 10 and 20 (6 s of steps, then a 1 s stall each): recorded at 12, 19."""
    log.save(10, 12, stall_seconds=1.0, train_seconds=6.0, loop_seconds=7.0)
    return log.save(20, 19, stall_seconds=1.0, train_seconds=12.0, loop_seconds=14.0)


def failed_and_resumed() -> Log:
    """Attempt 1 reaches step 24 (dies at 21.4), `failed` at 22.4, resumed at 25 from step 20; attempt 2's loop
    starts at 30, saves step 30 (recorded at 37, 4 steps lost), completes at 38."""
    log = Log()
    newest = first_attempt(log)
    log.fail(22.4)
    log.resume(newest, 25, attempt=2, count=1)
    log.save(30, 37, attempt=2, stall_seconds=1.0, train_seconds=6.0, loop_seconds=7.0, lost_steps=4)
    log.complete(38, attempt=2)
    return log


def terms(g: Goodput) -> tuple[float | None, ...]:
    return tuple(
        None if v is None else round(v, 9)
        for v in (
            g.wall,
            g.productive,
            g.checkpoint_stall,
            g.startup,
            g.restart,
            g.down,
            g.recomputed,
            g.other,
        )
    )


def test_a_run_without_failures_splits_its_wall_time_into_training_stalls_start_up_and_its_end() -> None:
    log = Log()
    first_attempt(log)
    log.complete(21)
    g = log.measure()
    assert terms(g) == (21.0, 12.0, 2.0, 5.0, 0.0, 0.0, 0.0, 2.0)
    assert (g.attempts, g.failures, g.saves, g.lost_steps, g.step_seconds) == (1, 0, 2, 0, 0.6)
    assert g.ratio == 12.0 / 21.0 and g.unknown == []


def test_a_failure_costs_down_time_a_restart_recomputed_steps_and_teardown_in_other() -> None:
    g = failed_and_resumed().measure()
    # productive 12 + 6; stall 3 saves; start-up 0 → 5; restart 25 → 30; down 22.4 → 25; recomputed 4 × 0.6;
    # other: teardown 21.4 → 22.4 and the end 37 → 38
    assert terms(g) == (38.0, 18.0, 3.0, 5.0, 5.0, 2.6, 2.4, 2.0)
    assert (g.attempts, g.failures, g.saves, g.lost_steps, g.step_seconds) == (2, 1, 3, 4, 0.6)


def test_lost_steps_the_resumed_trainer_timed_are_recomputed_as_timed_not_estimated() -> None:
    log = Log()
    newest = first_attempt(log)
    log.fail(22.4)
    log.resume(newest, 25, attempt=2, count=1)
    log.save(30, 37, attempt=2, stall_seconds=1.0, train_seconds=6.0, loop_seconds=7.0, lost_steps=4,
             lost_seconds=3.1)  # fmt: skip
    log.complete(38, attempt=2)
    timed = log.measure()
    estimated = failed_and_resumed().measure()
    assert (timed.recomputed, timed.recomputed_estimated) == (3.1, False)
    assert (estimated.recomputed, estimated.recomputed_estimated) == (pytest.approx(2.4), True)
    assert timed.other == pytest.approx(estimated.other + 2.4 - 3.1)  # the estimate's error was in other


def test_the_terms_always_sum_to_the_wall_time() -> None:
    g = failed_and_resumed().measure()
    parts = [g.productive, g.checkpoint_stall, g.startup, g.restart, g.down, g.recomputed, g.other]
    assert sum(p for p in parts if p is not None) == pytest.approx(g.wall)


def test_an_old_log_folds_with_what_it_cannot_tell_unknown_not_zero() -> None:
    log = Log()  # written before goodput fields and before attempts
    log.save(10, 12, attempt=0)
    newest = log.save(20, 19, attempt=0)
    log.fail(22.4, attempt=0)
    log.resume(newest, 25, attempt=0, count=1)
    log.save(30, 37, attempt=0)
    log.complete(38, attempt=0)
    g = log.measure()
    assert terms(g) == (38.0, None, None, None, None, 2.6, None, 35.4)
    assert g.ratio is None and g.lost_steps is None and g.step_seconds is None
    assert g.unknown == ["productive", "checkpoint_stall", "startup", "restart", "recomputed"]
    assert (g.attempts, g.failures, g.saves) == (2, 1, 3)


def test_a_running_run_is_measured_up_to_now_and_a_failed_one_is_down_since_its_failure() -> None:
    log = Log()
    first_attempt(log)
    running = log.measure(now=30)
    assert terms(running) == (30.0, 12.0, 2.0, 5.0, 0.0, 0.0, 0.0, 11.0)
    log.fail(22.4)
    failed = log.measure(now=30)
    assert terms(failed) == (30.0, 12.0, 2.0, 5.0, 0.0, 7.6, 0.0, 3.4)
    assert failed.failures == 1


def test_a_completed_run_ends_at_completion_whatever_now_is() -> None:
    assert failed_and_resumed().measure(now=5000).wall == 38.0


def test_a_refused_checkpoint_and_the_trainers_fallback_move_what_was_kept_and_from_where() -> None:
    log = Log()
    older = log.save(10, 12, stall_seconds=1.0, train_seconds=6.0, loop_seconds=7.0)
    newest = log.save(20, 19, stall_seconds=1.0, train_seconds=12.0, loop_seconds=14.0)
    log.fail(22.4)
    log.resume(newest, 25, attempt=2, count=1)  # the supervisor opens attempt 2 from step 20 …
    log.add(CorruptSkipped(run_id=RUN, checkpoint_seq=newest.seq, step=20, uri=newest.uri, reason="bad"), 29)
    log.resume(older, 29.5, attempt=2, count=2)  # … the trainer finds it corrupt and falls back to step 10
    # attempt 2 re-does steps 11..24 (14 lost), trains 10 steps (6 s) to step 20
    log.save(20, 37, attempt=2, stall_seconds=1.0, train_seconds=6.0, loop_seconds=7.0, lost_steps=14)
    log.complete(38, attempt=2)
    g = log.measure()
    assert (g.productive, g.attempts, g.lost_steps) == (6.0 + 6.0, 2, 14)
    assert g.recomputed == pytest.approx(14 * 0.6)
    assert g.step_seconds == pytest.approx((12.0 + 6.0) / (20 + 10))  # attempt 2 trained from step 10


def test_a_forced_resume_opens_an_attempt_without_down_time() -> None:
    log = Log()
    newest = first_attempt(log)
    log.resume(newest, 25, attempt=2, count=1)  # forced: the log still said running
    log.save(30, 37, attempt=2, stall_seconds=1.0, train_seconds=6.0, loop_seconds=7.0, lost_steps=0)
    log.complete(38, attempt=2)
    g = log.measure()
    assert (g.attempts, g.failures, g.down, g.restart, g.recomputed) == (2, 0, 0.0, 5.0, 0.0)


def test_forced_resumes_in_a_row_each_open_an_attempt() -> None:
    log = Log()
    newest = first_attempt(log)
    log.resume(newest, 25, attempt=2, count=1)
    log.resume(newest, 26, attempt=3, count=2)
    assert log.measure(now=30).attempts == 3


def test_a_fallback_within_the_first_attempt_moves_where_it_trained_from() -> None:
    log = Log()
    older = log.save(10, 12, stall_seconds=1.0, train_seconds=6.0, loop_seconds=7.0)
    newest = log.save(20, 19, stall_seconds=1.0, train_seconds=12.0, loop_seconds=14.0)
    log.add(CorruptSkipped(run_id=RUN, checkpoint_seq=newest.seq, step=20, uri=newest.uri, reason="bad"), 20)
    log.resume(older, 20.5, attempt=1, count=1)  # e.g. a trainer started by hand, falling back at start-up
    log.save(20, 27, stall_seconds=1.0, train_seconds=6.0, loop_seconds=7.0)
    g = log.measure(now=30)
    assert (g.attempts, g.step_seconds) == (1, 6.0 / 10)


def test_a_restart_in_place_after_a_failure_is_a_new_start_of_the_processes() -> None:
    log = Log()
    newest = first_attempt(log)
    log.fail(22.4)
    log.resume(newest, 25, attempt=1, count=1)  # the same attempt: its launcher restarted the workers
    log.save(30, 37, stall_seconds=1.0, train_seconds=6.0, loop_seconds=7.0, lost_steps=4)
    log.complete(38)
    assert terms(log.measure()) == terms(failed_and_resumed().measure())


def test_an_attempt_that_died_before_its_first_checkpoint_leaves_its_start_up_unknown() -> None:
    log = Log()
    log.fail(10)  # no checkpoint: nothing kept, its start unknown
    log.resume(None, 12, attempt=2, count=1)  # a restart from step 0
    log.save(10, 24, attempt=2, stall_seconds=1.0, train_seconds=6.0, loop_seconds=7.0, lost_steps=5)
    log.complete(25, attempt=2)
    g = log.measure()
    # recomputed: 5 lost steps at the run's mean pace (attempt 1 measured none)
    assert terms(g) == (25.0, 6.0, 1.0, None, 5.0, 2.0, 3.0, 8.0)
    assert g.unknown == ["startup"] and g.ratio == 6.0 / 25.0


def test_lost_steps_unknown_leave_recomputed_unknown_and_zero_lost_steps_cost_nothing_even_at_no_pace() -> (
    None
):
    log = Log()
    newest = log.save(10, 12, stall_seconds=1.0, loop_seconds=7.0)  # no training time: no pace anywhere
    log.fail(20)
    log.resume(newest, 22, attempt=2, count=1)
    log.save(20, 30, attempt=2, stall_seconds=1.0, loop_seconds=4.0, lost_steps=0)
    assert log.measure().recomputed == 0.0
    unknown = Log()
    newest = unknown.save(10, 12, stall_seconds=1.0, loop_seconds=7.0)
    unknown.fail(20)
    unknown.resume(newest, 22, attempt=2, count=1)
    unknown.save(20, 30, attempt=2, stall_seconds=1.0, loop_seconds=4.0, lost_steps=3)
    assert unknown.measure().recomputed is None  # lost steps, but no pace to price them at
    running = Log()
    newest = first_attempt(running)
    running.fail(22.4)
    running.resume(newest, 25, attempt=2, count=1)  # attempt 2 has not reported its lost steps yet
    g = running.measure(now=28)
    assert (g.recomputed, g.restart, g.lost_steps) == (None, None, None)


def test_the_loop_start_and_lost_steps_come_from_the_first_checkpoint_that_reports_them() -> None:
    log = Log()
    log.save(10, 12, stall_seconds=1.0, train_seconds=6.0)  # e.g. a save recorded by an older writer
    log.save(20, 19, stall_seconds=1.0, train_seconds=12.0, loop_seconds=14.0)
    newest = log.save(30, 26, stall_seconds=1.0, train_seconds=18.0, loop_seconds=99.0)
    assert log.measure(now=30).startup == 5.0
    log.fail(30)
    log.resume(newest, 31, attempt=2, count=1)
    log.save(40, 50, attempt=2, stall_seconds=1.0, train_seconds=12.0, loop_seconds=10.0)
    log.save(50, 57, attempt=2, stall_seconds=1.0, train_seconds=18.0, loop_seconds=17.0, lost_steps=12)
    log.save(60, 64, attempt=2, stall_seconds=1.0, train_seconds=24.0, loop_seconds=24.0, lost_steps=99)
    g = log.measure(now=70)
    assert (g.lost_steps, g.restart) == (12, 9.0)
    assert g.recomputed == pytest.approx(12 * 18.0 / 30)  # attempt 1's pace: its last save, 30 steps


def test_a_first_checkpoint_at_step_zero_measures_no_pace_and_one_step_measures_one() -> None:
    log = Log()
    zero = log.save(0, 6, stall_seconds=1.0, train_seconds=0.0, loop_seconds=1.0)
    assert log.measure(now=10).step_seconds is None
    log.fail(10)
    log.resume(zero, 11, attempt=2, count=1)
    log.save(1, 20, attempt=2, stall_seconds=1.0, train_seconds=0.6, loop_seconds=1.6, lost_steps=3)
    g = log.measure(now=30)
    assert g.step_seconds == 0.6
    assert g.recomputed == pytest.approx(3 * 0.6)  # attempt 1 trained no step to its save: the run's pace


def test_down_time_adds_up_over_failures() -> None:
    log = Log()
    newest = first_attempt(log)
    log.fail(22.4)
    log.resume(newest, 25, attempt=2, count=1)
    newest = log.save(30, 37, attempt=2, stall_seconds=1.0, train_seconds=6.0, loop_seconds=7.0, lost_steps=4)
    log.fail(40, attempt=2)
    assert log.measure(now=43).down == pytest.approx(2.6 + 3.0)
    log.resume(newest, 44, attempt=3, count=2)
    assert log.measure(now=50).down == pytest.approx(2.6 + 4.0)


def test_an_old_supervisors_resume_then_a_newer_trainers_fallback_stay_one_attempt() -> None:
    log = Log()
    older = log.save(10, 12, attempt=0)
    newest = log.save(20, 19, attempt=0)
    log.fail(22.4, attempt=0)
    log.resume(newest, 25, attempt=0, count=1)  # an old supervisor: no attempt number, it opens attempt 2
    log.add(CorruptSkipped(run_id=RUN, checkpoint_seq=newest.seq, step=20, uri=newest.uri, reason="bad"), 29)
    log.resume(older, 29.5, attempt=2, count=2)  # a newer trainer falls back within attempt 2
    assert log.measure().attempts == 2


def test_time_is_never_negative_and_a_run_of_no_wall_time_has_no_ratio() -> None:
    log = Log()
    log.save(
        10, 12, stall_seconds=1.0, train_seconds=6.0, loop_seconds=20.0
    )  # the loop "began" before launch
    g = log.measure(now=12)
    assert g.startup == 0.0
    assert log.measure(now=-5).wall == 0.0  # a clock behind the launch
    assert log.measure(now=0).ratio is None  # exactly no wall time yet
    assert log.measure(now=0.5).ratio == 6.0 / 0.5


def test_events_must_begin_with_launched() -> None:
    log = Log()
    with pytest.raises(ValueError, match=r"^a run's events begin with `launched`, not Checkpointed$"):
        measure([log.save(10, 12), *log.events], at(20))


def test_a_checkpoint_without_measurements_encodes_as_before() -> None:
    event = Checkpointed(run_id=RUN, step=1, epoch=0, shards=1, uri="u", checkpoint_hash="h", size_bytes=0)
    assert event.stall_seconds is UNSET
    assert b"seconds" not in msgspec.json.encode(event) and b"lost_steps" not in msgspec.json.encode(event)


def test_the_lost_steps_are_told_apart_by_the_tier_each_resume_loaded_from() -> None:
    """Attempt 1 snapshots step 24 in memory after its durable step 20 and dies at 26; the relaunch opens from
    step 20, its trainer resumes from memory at 24 (2 steps lost); attempt 2 dies too, its memory snapshot lost
    with its node, and attempt 3 resumes from the durable step 30 (3 steps lost)."""
    log = Log()
    newest = first_attempt(log)
    snapshot = log.add(Snapshotted(run_id=RUN, step=24, epoch=0, shards=1, uri="file:///dev/shm/s24",
                                   checkpoint_hash=f"{1024:064x}", size_bytes=1, attempt=1), 21)  # fmt: skip
    log.fail(22.4)
    log.resume(newest, 25, attempt=2, count=1)
    log.add(Resumed(run_id=RUN, checkpoint_seq=snapshot.seq, step=24, epoch=0, uri="file:///dev/shm/s24",
                    checkpoint_hash=f"{1024:064x}", resume_count=2, attempt=2, tier="memory"), 26)  # fmt: skip
    thirty = log.save(30, 37, attempt=2, stall_seconds=1.0, train_seconds=4.0, loop_seconds=7.0, lost_steps=2)
    log.fail(40, attempt=2)
    log.resume(thirty, 42, attempt=3, count=3)
    log.save(40, 55, attempt=3, stall_seconds=1.0, train_seconds=6.0, loop_seconds=7.0, lost_steps=3)
    g = log.measure()
    assert (g.lost_steps, g.lost_by_tier) == (5, {"memory": 2, "durable": 3})
    assert failed_and_resumed().measure().lost_by_tier == {"durable": 4}
    assert by_tier(g) == "memory 2, durable 3"
    assert (
        by_tier(msgspec.structs.replace(g, lost_by_tier={"peer": 2, "durable": 3})) == "peer 2, durable 3"
    ), "a resume from a peer's replica is the memory tier's too"
    assert by_tier(failed_and_resumed().measure()) == "", "durable storage alone: nothing to tell apart"


def test_a_resume_from_memory_keeps_the_training_up_to_the_snapshot_it_loaded() -> None:
    """Attempt 1 trains to its durable step 20 (12 s), snapshots step 24 in memory after 14.5 s of training
    and dies; its successor resumes from the snapshot: 14.5 s of attempt 1 were kept, not 12. A snapshot
    whose writer did not measure its training keeps the durable checkpoint's, as before."""

    def run(train_seconds: float | msgspec.UnsetType) -> Goodput:
        log = Log()
        newest = first_attempt(log)
        snapshot = log.add(Snapshotted(run_id=RUN, step=24, epoch=0, shards=1, uri="file:///dev/shm/s24",
                                       checkpoint_hash=f"{1024:064x}", size_bytes=1, attempt=1,
                                       train_seconds=train_seconds), 21)  # fmt: skip
        log.fail(22.4)
        log.resume(newest, 25, attempt=2, count=1)
        log.add(Resumed(run_id=RUN, checkpoint_seq=snapshot.seq, step=24, epoch=0, uri="file:///dev/shm/s24",
                        checkpoint_hash=f"{1024:064x}", resume_count=2, attempt=2, tier="memory"), 26)  # fmt: skip
        log.save(30, 37, attempt=2, stall_seconds=1.0, train_seconds=4.0, loop_seconds=7.0, lost_steps=2)
        log.complete(38, attempt=2)
        return log.measure()

    measured, unmeasured = run(14.5), run(UNSET)
    assert (measured.productive, unmeasured.productive) == (14.5 + 4.0, 12.0 + 4.0)
    assert measured.other == pytest.approx(unmeasured.other - 2.5), "the kept steps leave `other`"
    assert b"train_seconds" not in msgspec.json.encode(
        Snapshotted(run_id=RUN, step=1, epoch=0, shards=1, uri="u", checkpoint_hash="h", size_bytes=0)
    ), "a snapshot without measurements encodes as before"
