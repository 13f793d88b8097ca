"""The deciders build exactly the event a request means: every field, compared whole, for each request."""

from datetime import UTC, datetime, timedelta

from events.schema import Checkpointed, Completed, CorruptSkipped, Resumed
from projections.lifecycle import (
    CheckpointIntent,
    CompleteIntent,
    ResumeIntent,
    RunState,
    SkipIntent,
    corrupt_skipped_event,
    decide_intent,
    restart_event,
    resume_from,
    resumed_event,
)
from projections.lifecycle import skip as skip_checkpoint
from tests.test_judge_rules import FAILED, RUN, T0, ckpt, fold, launched

AT = T0 + timedelta(hours=1)
COMMAND = ("torchrun",)


def test_a_resume_names_the_checkpoint_and_relaunches_the_launch_command() -> None:
    state = fold(launched(), ckpt(10, epoch=2), FAILED)
    ref = state.checkpoints[0]
    assert resumed_event(state, ref, forced=True) == Resumed(
        run_id=RUN, checkpoint_seq=2, step=10, epoch=2, uri="u10", checkpoint_hash=ref.checkpoint_hash,
        resume_count=1, forced=True, command=COMMAND, attempt=2,
    )  # fmt: skip


def test_a_restart_names_no_checkpoint_and_relaunches_the_launch_command() -> None:
    state = fold(launched(), FAILED)
    assert restart_event(state, forced=True) == Resumed(
        run_id=RUN, checkpoint_seq=0, step=0, epoch=0, uri="", checkpoint_hash="", resume_count=1, forced=True,
        command=COMMAND, attempt=2,
    )  # fmt: skip


def test_a_skip_names_the_checkpoint_and_the_reason() -> None:
    state = fold(launched(), ckpt(10))
    assert corrupt_skipped_event(state, state.checkpoints[0], "hash mismatch") == CorruptSkipped(
        run_id=RUN, checkpoint_seq=2, step=10, uri="u10", reason="hash mismatch"
    )


def test_a_completion_is_recorded_for_the_run() -> None:
    decided = decide_intent(fold(launched()), CompleteIntent(), "i", AT)
    assert isinstance(decided, Completed)
    assert (decided.run_id, decided.id, decided.time) == (RUN, "i", AT)


def test_a_checkpoint_intent_is_recorded_for_the_run_whatever_run_id_it_carried() -> None:
    state = fold(launched())
    foreign = Checkpointed(run_id="elsewhere", step=10, epoch=0, shards=1, uri="u10", checkpoint_hash="a" * 64,
                           size_bytes=1)  # fmt: skip
    decided = decide_intent(state, CheckpointIntent(checkpointed=foreign), "i", AT)
    assert decided == Checkpointed(run_id=RUN, id="i", time=AT, step=10, epoch=0, shards=1, uri="u10",
                                   checkpoint_hash="a" * 64, size_bytes=1)  # fmt: skip


def unrecorded_state() -> RunState:
    return fold(launched(), ckpt(10), FAILED)


def test_a_skip_of_a_checkpoint_the_log_never_recorded_names_seq_0_and_the_trainers_step() -> None:
    intent = SkipIntent(checkpoint_hash="e" * 64, step=30, reason="hash mismatch")
    assert decide_intent(unrecorded_state(), intent, "i", AT) == CorruptSkipped(
        run_id=RUN, id="i", time=AT, checkpoint_seq=0, step=30, uri="", reason="hash mismatch"
    )


def test_a_resume_from_a_checkpoint_the_log_never_recorded_names_it_for_the_judge_to_refuse() -> None:
    intent = ResumeIntent(checkpoint_hash="e" * 64, step=30)
    assert decide_intent(unrecorded_state(), intent, "i", AT) == Resumed(
        run_id=RUN, id="i", time=AT, checkpoint_seq=0, step=30, epoch=0, uri="", checkpoint_hash="e" * 64,
        resume_count=1, forced=False, command=COMMAND, attempt=2,
    )  # fmt: skip


def test_a_restart_intent_is_forced_only_while_the_log_says_running() -> None:
    restart = ResumeIntent(checkpoint_hash=None, step=0)
    running = decide_intent(fold(launched()), restart, "i", AT)
    failed = decide_intent(fold(launched(), FAILED), restart, "i", AT)
    assert isinstance(running, Resumed) and isinstance(failed, Resumed)
    assert (running.forced, failed.forced) == (True, False)
    assert running.time == datetime(2026, 1, 1, 1, tzinfo=UTC)


def test_resume_from_the_newest_valid_checkpoint_is_forced_only_while_running() -> None:
    running = fold(launched(), ckpt(10), ckpt(20))
    failed = fold(launched(), ckpt(10), ckpt(20), FAILED)
    newest, older = running.checkpoints[1], running.checkpoints[0]
    assert resume_from(running, newest, forced=True) == resumed_event(running, newest, forced=True)
    assert resume_from(failed, newest, forced=True) == resumed_event(failed, newest, forced=False)
    assert resume_from(failed, older, forced=False) is None, "another writer's newer checkpoint: decide again"
    assert resume_from(fold(launched(), ckpt(10), FAILED, skip(2)), older, forced=False) is None


def skip(seq: int) -> CorruptSkipped:
    return CorruptSkipped(run_id=RUN, checkpoint_seq=seq, step=10, uri="u10", reason="hash mismatch")


def test_skip_refuses_a_valid_checkpoint_once() -> None:
    state = fold(launched(), ckpt(10), FAILED)
    ref = state.checkpoints[0]
    assert skip_checkpoint(state, ref, "hash mismatch") == CorruptSkipped(
        run_id=RUN, checkpoint_seq=2, step=10, uri="u10", reason="hash mismatch"
    )
    assert skip_checkpoint(fold(launched(), ckpt(10), FAILED, skip(2)), ref, "again") is None
    assert skip_checkpoint(fold(launched(), FAILED), ref, "unknown") is None
