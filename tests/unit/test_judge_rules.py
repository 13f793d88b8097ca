"""Each rule the judge enforces, one test per rule, through the pure API.

The events here are built by hand, the way a forged or buggy writer would build them, never by the deciders or
the CLI: a rule must hold for whatever reaches `check`/`apply`, not only for what the CLI's argument checks let
through. Each refusal is matched on the rule's own message.
"""

import re
from datetime import timedelta

import pytest

from ftrain.domain.lifecycle import IllegalTransition, RunState, check
from ftrain.events.chain import ChainHead
from ftrain.events.schema import AnyEvent, Checkpointed, Completed, CorruptSkipped, Failed, Launched, Resumed
from tests.support.builders import T0, fold

RUN = "r"


def launched() -> Launched:
    return Launched(
        run_id=RUN, project="p", strategy="fsdp", nodes=1, gpus_per_node=2, hosts=("a",),
        allocation_source="nodelist", rdzv_endpoint="a:29500", command=("torchrun",), storage="file:///s",
    )  # fmt: skip


def ckpt(step: int, *, epoch: int = 0, shards: int = 1) -> Checkpointed:
    return Checkpointed(run_id=RUN, step=step, epoch=epoch, shards=shards, uri=f"u{step}",
                        checkpoint_hash=f"{step:064x}", size_bytes=1)  # fmt: skip


def resumed(seq: int, step: int, *, count: int = 1, epoch: int = 0, checkpoint_hash: str | None = None,
            uri: str | None = None, forced: bool = False) -> Resumed:  # fmt: skip
    return Resumed(run_id=RUN, checkpoint_seq=seq, step=step, epoch=epoch,
                   uri=f"u{step}" if uri is None else uri,
                   checkpoint_hash=f"{step:064x}" if checkpoint_hash is None else checkpoint_hash,
                   resume_count=count, forced=forced)  # fmt: skip


def restart(
    *, count: int = 1, step: int = 0, epoch: int = 0, uri: str = "", checkpoint_hash: str = ""
) -> Resumed:
    return Resumed(run_id=RUN, checkpoint_seq=0, step=step, epoch=epoch, uri=uri,
                   checkpoint_hash=checkpoint_hash, resume_count=count)  # fmt: skip


FAILED = Failed(run_id=RUN, reason="preempted")
COMPLETED = Completed(run_id=RUN, cost_gpu_hours=1.0, running_seconds=60.0, cost_source="reported")


def refused(state: RunState | None, event: AnyEvent, message: str) -> None:
    """`event` is refused after `state` with exactly the rule's message."""
    with pytest.raises(IllegalTransition, match=f"^{re.escape(message)}$"):
        check(state, event)


# -- existence and closure -----------------------------------------------------------------------------------


@pytest.mark.parametrize("event", [ckpt(1), FAILED, COMPLETED, restart()])
def test_nothing_but_a_launch_may_start_a_run(event: AnyEvent) -> None:
    kind = type(event).__struct_config__.tag
    refused(None, event, f"run {RUN} does not exist; it cannot be {kind}")


def test_a_run_is_launched_once() -> None:
    check(None, launched())
    refused(fold(launched(), FAILED), launched(), f"run {RUN} already exists (failed)")


@pytest.mark.parametrize("event", [ckpt(5), FAILED, COMPLETED, restart(), resumed(1, 1, forced=True)])
def test_nothing_may_follow_completion_even_a_forced_resume(event: AnyEvent) -> None:
    refused(fold(launched(), COMPLETED), event, f"run {RUN} is completed; nothing may follow completion")


@pytest.mark.parametrize("event", [ckpt(5), FAILED, COMPLETED])
def test_only_a_running_run_checkpoints_fails_or_completes(event: AnyEvent) -> None:
    kind = type(event).__struct_config__.tag
    refused(fold(launched(), FAILED), event, f"run {RUN} is failed; it cannot be {kind} (resume it first)")


# -- checkpointed --------------------------------------------------------------------------------------------


def test_a_checkpoint_at_step_0_epoch_0_with_one_shard_is_the_least_that_is_legal() -> None:
    state = fold(launched(), ckpt(0, epoch=0, shards=1))
    assert (state.step, state.epoch, len(state.checkpoints)) == (0, 0, 1)


@pytest.mark.parametrize(
    "event",
    [ckpt(-1), ckpt(5, epoch=-1), ckpt(5, shards=0), ckpt(-1, epoch=-1, shards=0)],
    ids=["negative-step", "negative-epoch", "no-shards", "all-three"],
)
def test_a_forged_checkpoint_out_of_bounds_is_refused_by_the_judge_itself(event: Checkpointed) -> None:
    refused(fold(launched()), event, "step and epoch must be ≥ 0 and shards ≥ 1")


def test_a_checkpoint_must_advance_past_the_last_one() -> None:
    state = fold(launched(), ckpt(10))
    for step in (10, 9):
        refused(state, ckpt(step), f"run {RUN} is at step 10; checkpoint step {step} does not advance it")
    check(state, ckpt(11))


def test_after_a_resume_a_checkpoint_must_advance_past_the_resumed_step() -> None:
    state = fold(launched(), ckpt(10), ckpt(20), FAILED, resumed(3, 20))
    refused(state, ckpt(20), f"run {RUN} is at step 20; checkpoint step 20 does not advance it")


def test_after_a_restart_from_step_0_a_checkpoint_at_step_0_does_not_advance_the_run() -> None:
    """No checkpoint yet, but a resume: the step the run restarted from counts."""
    state = fold(launched(), FAILED, restart())
    assert (state.checkpoints, state.resume_count, state.step) == ((), 1, 0)
    refused(state, ckpt(0), f"run {RUN} is at step 0; checkpoint step 0 does not advance it")
    check(state, ckpt(1))


# -- corrupt_skipped -----------------------------------------------------------------------------------------


def skipped(seq: int, step: int) -> CorruptSkipped:
    return CorruptSkipped(run_id=RUN, checkpoint_seq=seq, step=step, uri=f"u{step}", reason="hash mismatch")


def test_a_skip_names_a_recorded_checkpoint() -> None:
    refused(fold(launched(), ckpt(10)), skipped(1, 10), f"run {RUN} has no valid checkpoint at seq 1")
    check(fold(launched(), ckpt(10)), skipped(2, 10))


def test_a_checkpoint_is_skipped_once() -> None:
    state = fold(launched(), ckpt(10), FAILED, skipped(2, 10))
    refused(state, skipped(2, 10), f"run {RUN} has no valid checkpoint at seq 2")


def test_a_skip_must_name_the_checkpoints_step() -> None:
    refused(fold(launched(), ckpt(10)), skipped(2, 11), f"run {RUN} has no valid checkpoint at seq 2")


def test_a_skip_while_running_or_failed_marks_only_that_checkpoint_corrupt() -> None:
    state = fold(launched(), ckpt(10), ckpt(20), skipped(3, 20))
    assert [(c.step, c.status, c.reason) for c in state.checkpoints] == [
        (10, "valid", None),
        (20, "corrupt", "hash mismatch"),
    ]
    assert state.status == "running"


# -- resumed from a checkpoint -------------------------------------------------------------------------------


def test_a_running_run_resumes_only_when_forced() -> None:
    state = fold(launched(), ckpt(10))
    refused(state, resumed(2, 10), f"run {RUN} is running; resume follows a failure (or use --force)")
    check(state, resumed(2, 10, forced=True))


def test_a_resume_names_the_newest_valid_checkpoint() -> None:
    state = fold(launched(), ckpt(10), ckpt(20), FAILED)
    message = f"run {RUN} must resume from its newest valid checkpoint, not seq 2"
    refused(state, resumed(2, 10), message)
    check(state, resumed(3, 20))


def test_a_resume_from_a_checkpoint_when_none_is_valid_is_refused() -> None:
    state = fold(launched(), ckpt(10), FAILED, skipped(2, 10))
    assert state.valid_checkpoints() == []
    refused(state, resumed(2, 10), f"run {RUN} must resume from its newest valid checkpoint, not seq 2")


def test_a_forged_resume_naming_the_wrong_hash_is_refused() -> None:
    state = fold(launched(), ckpt(10), FAILED)
    forged = resumed(2, 10, checkpoint_hash="f" * 64)
    refused(state, forged, "resumed event does not match checkpoint seq 2")


def test_a_forged_resume_naming_the_wrong_step_is_refused() -> None:
    state = fold(launched(), ckpt(10), FAILED)
    forged = resumed(2, 11, checkpoint_hash=f"{10:064x}")
    refused(state, forged, "resumed event does not match checkpoint seq 2")


@pytest.mark.parametrize("count", [0, 1, 3])
def test_a_resume_counts_exactly_one_more_resume(count: int) -> None:
    state = fold(launched(), ckpt(10), FAILED, resumed(2, 10), FAILED)
    assert state.resume_count == 1
    refused(state, resumed(2, 10, count=count), f"resume count must be 2, not {count}")
    assert (
        fold(launched(), ckpt(10), FAILED, resumed(2, 10), FAILED, resumed(2, 10, count=2)).resume_count == 2
    )


# -- restarted from step 0 -----------------------------------------------------------------------------------


def test_a_restart_is_only_for_a_run_that_never_checkpointed() -> None:
    state = fold(launched(), ckpt(10), FAILED, skipped(2, 10))
    message = f"run {RUN} has checkpoints; it resumes from one or not at all, never from step 0"
    refused(state, restart(), message)


@pytest.mark.parametrize(
    "forged",
    [restart(step=5), restart(epoch=1), restart(uri="u5"), restart(checkpoint_hash="f" * 64)],
    ids=["step", "epoch", "uri", "hash"],
)
def test_a_restart_names_no_checkpoint(forged: Resumed) -> None:
    refused(fold(launched(), FAILED), forged, "a restart from step 0 names no checkpoint")


@pytest.mark.parametrize("count", [0, 2])
def test_a_restart_with_the_wrong_resume_count_is_refused(count: int) -> None:
    refused(fold(launched(), FAILED), restart(count=count), f"resume count must be 1, not {count}")
    state = fold(launched(), FAILED, restart(), FAILED)
    refused(state, restart(count=1), "resume count must be 2, not 1")
    check(state, restart(count=2))


# -- the fold ------------------------------------------------------------------------------------------------


def test_a_new_run_is_running_at_step_0_epoch_0_with_nothing_behind_it() -> None:
    state = fold(launched())
    assert (state.status, state.step, state.epoch, state.resume_count, state.failures) == (
        "running",
        0,
        0,
        0,
        0,
    )
    assert (state.checkpoints, state.last_failure, state.running_since) == (
        (),
        None,
        T0 + timedelta(minutes=1),
    )
    assert (state.project, state.head, state.updated_at) == (
        "p",
        ChainHead(1, f"{1:064x}", 1),
        state.running_since,
    )


def test_a_checkpoint_sets_the_step_and_epoch_and_a_failure_its_reason() -> None:
    state = fold(launched(), ckpt(10, epoch=3), FAILED)
    assert (state.step, state.epoch, state.status, state.failures, state.last_failure) == (
        10,
        3,
        "failed",
        1,
        "preempted",
    )
    assert (state.running_since, state.running_seconds) == (None, 120.0)


def test_a_resume_sets_the_step_and_epoch_it_resumed_from() -> None:
    skip_20 = skipped(3, 20)
    state = fold(launched(), ckpt(10, epoch=1), ckpt(20, epoch=2), FAILED, skip_20, resumed(2, 10, epoch=1))
    assert (state.status, state.step, state.epoch, state.resume_count) == ("running", 10, 1, 1)
    assert (state.running_since, state.running_seconds) == (T0 + timedelta(minutes=6), 180.0)


def test_a_forced_resume_keeps_the_wall_time_of_the_attempt_it_ends() -> None:
    state = fold(launched(), ckpt(10), resumed(2, 10, forced=True))
    assert (state.running_since, state.running_seconds) == (T0 + timedelta(minutes=3), 120.0)


def test_completion_stops_the_clock_at_the_reported_wall_time_and_cost() -> None:
    state = fold(launched(), COMPLETED)
    assert (state.status, state.running_since, state.running_seconds) == ("completed", None, 60.0)
    assert (state.cost_gpu_hours, state.cost_source) == (1.0, "reported")
