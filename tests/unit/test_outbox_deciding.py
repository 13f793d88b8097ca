"""Deciding an intent, pure: the event each intent of the recorder's outbox becomes against a run's state, and
what the fold then allows (the outbox file and the recorder against a real server:
tests/integration/test_outbox.py)."""

from datetime import timedelta

import msgspec
import pytest

from ftrain.domain.lifecycle import (
    CheckpointIntent,
    CompleteIntent,
    FailIntent,
    IllegalTransition,
    Intent,
    ResumeIntent,
    RunState,
    SkipIntent,
    apply,
    check,
    decide_intent,
)
from ftrain.events.chain import ChainHead
from ftrain.events.schema import (
    AnyEvent,
    Checkpointed,
    Completed,
    CorruptSkipped,
    Failed,
    Resumed,
)
from tests.support.builders import T0, fold, launched

RUN = "run-outbox"
AT = T0 + timedelta(hours=1)


def ckpt(step: int) -> CheckpointIntent:
    return CheckpointIntent(checkpointed=Checkpointed(run_id=RUN, step=step, epoch=step // 100, shards=1,
                            uri=f"file:///nowhere/step-{step}", checkpoint_hash=f"{step:064x}", size_bytes=step))  # fmt: skip


def recorded(intent: CheckpointIntent) -> Checkpointed:
    """The checkpointed event an intent becomes, unstamped, for building states."""
    return intent.checkpointed


def decided(state: RunState, intent: Intent) -> AnyEvent | None:
    return decide_intent(state, intent, "intent-1", AT)


FAILED = Failed(run_id=RUN, reason="preempted")


def test_checkpoint_becomes_checkpointed_stamped_with_the_intent_id_and_time() -> None:
    state = fold(launched(RUN))
    event = decided(state, ckpt(100))
    assert event == msgspec.structs.replace(recorded(ckpt(100)), id="intent-1", time=AT)
    check(state, event)


def test_checkpoint_already_in_the_log_decides_nothing() -> None:
    assert decided(fold(launched(RUN), recorded(ckpt(100))), ckpt(100)) is None


def test_skip_marks_the_valid_checkpoint_with_that_hash_and_only_once() -> None:
    state = fold(launched(RUN), recorded(ckpt(100)), recorded(ckpt(200)), FAILED)
    event = decided(
        state,
        SkipIntent(checkpoint_hash=ckpt(200).checkpointed.checkpoint_hash, step=200, reason="hash mismatch"),
    )
    assert isinstance(event, CorruptSkipped)
    assert (event.checkpoint_seq, event.step, event.reason, event.id) == (3, 200, "hash mismatch", "intent-1")
    check(state, event)
    skipped = apply(state, msgspec.structs.replace(event, seq=5), ChainHead(5, "5" * 64, 5))
    assert (
        decided(
            skipped, SkipIntent(checkpoint_hash=ckpt(200).checkpointed.checkpoint_hash, step=200, reason="x")
        )
        is None
    )


def test_skip_of_a_checkpoint_the_log_never_recorded_is_refused_by_the_fold() -> None:
    state = fold(launched(RUN), recorded(ckpt(100)))
    event = decided(state, SkipIntent(checkpoint_hash="f" * 64, step=300, reason="hash mismatch"))
    assert event is not None
    with pytest.raises(IllegalTransition, match="no valid checkpoint"):
        check(state, event)


def test_resume_from_the_newest_valid_checkpoint_after_a_failure_is_not_forced() -> None:
    state = fold(launched(RUN), recorded(ckpt(100)), recorded(ckpt(200)), FAILED)
    event = decided(state, ResumeIntent(checkpoint_hash=ckpt(200).checkpointed.checkpoint_hash, step=200))
    assert isinstance(event, Resumed)
    assert (event.checkpoint_seq, event.step, event.resume_count, event.forced) == (3, 200, 1, False)
    assert event.command == state.launch.command
    check(state, event)


def test_resume_while_the_log_says_running_is_forced() -> None:
    state = fold(launched(RUN), recorded(ckpt(100)))
    event = decided(state, ResumeIntent(checkpoint_hash=ckpt(100).checkpointed.checkpoint_hash, step=100))
    assert isinstance(event, Resumed)
    assert event.forced
    check(state, event)


@pytest.mark.parametrize("checkpoint_hash", [ckpt(100).checkpointed.checkpoint_hash, "e" * 64])
def test_resume_from_anything_but_the_newest_valid_checkpoint_is_refused_never_redirected(
    checkpoint_hash: str,
) -> None:
    """The trainer loaded `checkpoint_hash` (older, or unknown to the log): the log must not claim it resumed
    from the newest one instead."""
    state = fold(launched(RUN), recorded(ckpt(100)), recorded(ckpt(200)), FAILED)
    event = decided(state, ResumeIntent(checkpoint_hash=checkpoint_hash, step=100))
    assert isinstance(event, Resumed)
    assert event.checkpoint_hash == checkpoint_hash
    with pytest.raises(IllegalTransition):
        check(state, event)


def test_restart_from_step_0_is_legal_only_for_a_run_that_never_checkpointed() -> None:
    never = fold(launched(RUN), FAILED)
    event = decided(never, ResumeIntent(checkpoint_hash=None, step=0))
    assert isinstance(event, Resumed)
    assert (event.checkpoint_seq, event.step, event.resume_count) == (0, 0, 1)
    check(never, event)
    had_one = fold(launched(RUN), recorded(ckpt(100)), FAILED)
    refused = decided(had_one, ResumeIntent(checkpoint_hash=None, step=0))
    assert refused is not None
    with pytest.raises(IllegalTransition, match="never from step 0"):
        check(had_one, refused)


def test_fail_of_a_running_run_and_nothing_for_a_stopped_one() -> None:
    state = fold(launched(RUN))
    event = decided(state, FailIntent(reason="oom", exit_code=137, message="killed"))
    assert event == Failed(run_id=RUN, reason="oom", exit_code=137, message="killed", id="intent-1", time=AT)
    assert decided(fold(launched(RUN), FAILED), FailIntent(reason="oom")) is None


def test_complete_costs_reported_or_wall_time_at_the_intent_time_and_happens_once() -> None:
    state = fold(launched(RUN))  # running since T0 + 1 min, 1 GPU
    wall = decided(state, CompleteIntent())
    assert isinstance(wall, Completed)
    assert (wall.running_seconds, wall.cost_source) == (59 * 60, "wall-time")
    assert wall.cost_gpu_hours == pytest.approx(59 / 60)
    reported = decided(state, CompleteIntent(cost_gpu_hours=12.5))
    assert isinstance(reported, Completed)
    assert (reported.cost_gpu_hours, reported.cost_source) == (12.5, "reported")
    assert decided(fold(launched(RUN), wall), CompleteIntent()) is None
