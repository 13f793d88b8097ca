"""The deciders build exactly the event a request means: every field, compared whole, for each request."""

import re
from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from ftrain.domain.lifecycle import (
    CheckpointIntent,
    CompleteIntent,
    FailIntent,
    IllegalTransition,
    ResumeIntent,
    RunState,
    SkipIntent,
    check_owner,
    check_relaunch,
    completed_event,
    corrupt_skipped_event,
    decide_intent,
    relaunch,
    restart_event,
    resume_from,
    resumed_event,
)
from ftrain.domain.lifecycle import skip as skip_checkpoint
from ftrain.events.schema import (
    Actor,
    AnyEvent,
    Checkpointed,
    CheckpointPolicy,
    Completed,
    CorruptSkipped,
    DataPosition,
    Failed,
    Resumed,
    encode_event,
)
from tests.unit.test_judge_rules import FAILED, RUN, T0, ckpt, fold, launched

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


def test_a_trainers_resume_says_the_world_before_and_after_and_the_data_position() -> None:
    position = DataPosition(epoch=1, offset=64, consumed=576, seed=3)
    intent = ResumeIntent(checkpoint_hash="e" * 64, step=30, saved_world=4, world=2, data=position)
    decided = decide_intent(unrecorded_state(), intent, "i", AT)
    assert isinstance(decided, Resumed)
    assert (decided.saved_world, decided.world, decided.data) == (4, 2, position)
    payload = msgspec.json.decode(encode_event(decided))
    assert payload["data"] == {"epoch": 1, "offset": 64, "consumed": 576, "seed": 3}
    older = decide_intent(unrecorded_state(), ResumeIntent(checkpoint_hash="e" * 64, step=30), "i", AT)
    assert not {"saved_world", "world", "data"} & set(msgspec.json.decode(encode_event(older)))


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


# -- attempts ------------------------------------------------------------------------------------------------


def in_attempt(event: AnyEvent, attempt: int) -> AnyEvent:
    return msgspec.structs.replace(event, attempt=attempt)


SKIP_20 = CorruptSkipped(run_id=RUN, checkpoint_seq=3, step=20, uri="u20", reason="hash mismatch")


def test_a_relaunch_opens_the_next_attempt_unforced_from_the_newest_valid_checkpoint_or_from_step_0() -> None:
    """The supervisor relaunches a failed run: never forced (nothing else is running), attempt = current + 1."""
    never_checkpointed = fold(launched(), FAILED)
    assert relaunch(never_checkpointed) == Resumed(
        run_id=RUN, checkpoint_seq=0, step=0, epoch=0, uri="", checkpoint_hash="", resume_count=1, forced=False,
        command=COMMAND, attempt=2,
    )  # fmt: skip
    state = fold(launched(), ckpt(10), ckpt(20, epoch=1), FAILED, SKIP_20)
    assert relaunch(state) == Resumed(
        run_id=RUN, checkpoint_seq=2, step=10, epoch=0, uri="u10", checkpoint_hash=f"{10:064x}", resume_count=1,
        forced=False, command=COMMAND, attempt=2, saved_world=1, world=2,
    )  # fmt: skip
    assert relaunch(state, ("a",)) == msgspec.structs.replace(relaunch(state), hosts=("a",))  # on its nodes


def test_a_relaunch_says_the_world_before_and_after_and_the_data_position() -> None:
    """The trainer's own `resumed` folds into the attempt the supervisor opened, so the opening one says it:
    the checkpoint's shards, the attempt's nodes × processes per node, the checkpoint's data position."""
    position = DataPosition(epoch=0, offset=80, consumed=80, seed=1)
    saved = msgspec.structs.replace(ckpt(10, shards=4), data=position)
    two_nodes = msgspec.structs.replace(launched(), nodes=2, hosts=("a", "b"))
    shrunk = relaunch(fold(two_nodes, saved, FAILED), ("a",))
    assert (shrunk.saved_world, shrunk.world, shrunk.data) == (4, 2, position)
    assert relaunch(fold(two_nodes, saved, FAILED)).world == 4  # the launch's nodes


SAME = {"user": "alice", "project": "p", "gpus_per_node": 2, "strategy": "fsdp", "dataset_revision": None,
        "checkpoint_policy": None}  # fmt: skip


def test_only_a_failed_run_is_relaunched_and_only_as_it_was_launched() -> None:
    """On any number of nodes (the `resumed` names them), but with the launch's processes per node."""
    failed = fold(launched(), FAILED)
    check_relaunch(failed, **SAME)  # type: ignore[arg-type]
    running = "run r is running (another supervisor?); if it is dead, record that first: ftrain fail r"
    with pytest.raises(IllegalTransition, match=f"^{re.escape(running)}$"):
        check_relaunch(fold(launched()), **SAME)  # type: ignore[arg-type]
    other = ("run r was launched as p 1×2 fsdp; relaunch it with the same project, --gpus-per-node and --strategy "
             "(--nodes may change)")  # fmt: skip
    for field, value in (("project", "q"), ("gpus_per_node", 4), ("strategy", "ddp")):
        with pytest.raises(IllegalTransition, match=f"^{re.escape(other)}$"):
            check_relaunch(failed, **{**SAME, field: value})  # type: ignore[arg-type]


EVERY_100 = CheckpointPolicy("100steps", steps=100)


@pytest.mark.parametrize(
    ("launch", "given", "message"),
    [
        ({"dataset_revision": "v1"}, {"dataset_revision": "v2"},
         "run r was launched with --dataset-revision 'v1', not 'v2': relaunch it with the same, or pass a new "
         "--run-id for a new run"),
        ({"dataset_revision": "v1"}, {}, "run r was launched with --dataset-revision 'v1', not (none): "),
        ({}, {"dataset_revision": "v1"}, "run r was launched with --dataset-revision (none), not 'v1': "),
        ({"checkpoint_policy": EVERY_100}, {"checkpoint_policy": CheckpointPolicy("10m", seconds=600.0)},
         "run r was launched with --checkpoint-every '100steps', not '10m': relaunch it with the same"),
        ({"checkpoint_policy": EVERY_100}, {}, "run r was launched with --checkpoint-every '100steps', not (none)"),
    ],
)  # fmt: skip
def test_a_relaunch_with_other_data_or_cadence_is_refused_naming_both(
    launch: dict[str, object], given: dict[str, object], message: str
) -> None:
    """Its supervisor hands the trainer the launch's revision and cadence: a new one would be dropped unsaid."""
    failed = fold(msgspec.structs.replace(launched(), **launch), FAILED)
    with pytest.raises(IllegalTransition, match=f"^{re.escape(message)}"):
        check_relaunch(failed, **{**SAME, **given})  # type: ignore[arg-type]
    check_relaunch(failed, **{**SAME, **launch})  # type: ignore[arg-type]


def test_another_users_run_is_neither_relaunched_nor_taken_over() -> None:
    """On a log users share, a job of bob's naming alice's run (a recycled job id, or the same --run-id)."""
    alice = msgspec.structs.replace(launched(), actor=Actor(user="alice", host="n1", pid=7))
    message = "run r was launched by alice@n1, not by bob: pass a --run-id of your own"
    for state in (fold(alice), fold(alice, FAILED)):  # running (a takeover) or failed (a relaunch)
        with pytest.raises(IllegalTransition, match=f"^{re.escape(message)}$"):
            check_owner(state, "bob")
        check_owner(state, "alice")
    with pytest.raises(IllegalTransition, match=f"^{re.escape(message)}$"):
        check_relaunch(fold(alice, FAILED), **{**SAME, "user": "bob"})  # type: ignore[arg-type]
    check_relaunch(fold(alice, FAILED), **SAME)  # type: ignore[arg-type]


def test_a_completion_is_recorded_by_the_attempt_named_or_else_the_current_one() -> None:
    state = fold(
        launched(), FAILED, relaunch(fold(launched(), FAILED))
    )  # running in attempt 2 since minute 3
    end = T0 + timedelta(hours=2)
    seconds = 60.0 + (120 - 3) * 60.0  # attempt 1 ran minute 1 to 2, attempt 2 from minute 3
    assert completed_event(state, None, end) == Completed(
        run_id=RUN,
        cost_gpu_hours=seconds * 2 / 3600,
        running_seconds=seconds,
        cost_source="wall-time",
        attempt=2,
    )
    assert completed_event(state, 5.0, end, 0) == Completed(
        run_id=RUN, cost_gpu_hours=5.0, running_seconds=seconds, cost_source="reported", attempt=0
    )
    # an intent keeps its own attempt, even an old outbox row's 0: the judge decides whether it may record
    for attempt in (0, 2):
        decided = decide_intent(state, CompleteIntent(cost_gpu_hours=5.0, attempt=attempt), "i", end)
        assert decided == Completed(run_id=RUN, id="i", time=end, cost_gpu_hours=5.0, running_seconds=seconds,
                                    cost_source="reported", attempt=attempt)  # fmt: skip


def test_a_failure_is_recorded_with_the_intents_reason_exit_code_message_and_attempt_while_running() -> None:
    intent = FailIntent(reason="oom", exit_code=137, message="killed", attempt=1)
    assert decide_intent(fold(launched()), intent, "i", AT) == Failed(
        run_id=RUN, id="i", time=AT, reason="oom", exit_code=137, message="killed", attempt=1
    )
    assert decide_intent(fold(launched(), FAILED), intent, "i", AT) is None


def test_a_trainers_restart_in_its_attempt_names_that_attempt() -> None:
    state = fold(launched(), FAILED, relaunch(fold(launched(), FAILED)), in_attempt(FAILED, 2))
    decided = decide_intent(state, ResumeIntent(checkpoint_hash=None, step=0, attempt=2), "i", AT)
    assert isinstance(decided, Resumed) and (decided.checkpoint_seq, decided.attempt) == (0, 2)


def test_the_resume_a_supervisor_recorded_is_not_recorded_again_by_its_trainer() -> None:
    """One `resumed` per attempt: the trainer's own intent is None when the log's last `resumed` is of its attempt
    and named the checkpoint it loaded (or none, for a restart from step 0), attempt 1 included."""
    restarted = fold(launched(), FAILED, relaunch(fold(launched(), FAILED)))
    assert decide_intent(restarted, ResumeIntent(checkpoint_hash=None, step=0, attempt=2), "i", AT) is None
    fell_back = fold(launched(), in_attempt(ckpt(10), 1), in_attempt(ckpt(20), 1), SKIP_20,
                     resumed_event(fold(launched(), ckpt(10)), fold(launched(), ckpt(10)).checkpoints[0],
                                   forced=True, attempt=1))  # fmt: skip
    assert (fell_back.attempt, fell_back.resumed_in) == (1, 1)
    assert (
        decide_intent(fell_back, ResumeIntent(checkpoint_hash=f"{10:064x}", step=10, attempt=1), "i", AT)
        is None
    )
