"""The memory tier in the log, through the pure API: `snapshotted` never touches the durable tier, a resume
from memory names only the newest snapshot the log accepted (valid, newer than every durable checkpoint), a
corrupt snapshot is refused against its tier, the outbox's intents decide those events, logs from before
the tier (no `snapshotted`, no `tier`) read as they always did, and `status` and the timeline show it."""

import re
from datetime import timedelta

import msgspec
import pytest

from ftrain.cli import render
from ftrain.cli.queries import status_document
from ftrain.domain.lifecycle import (
    IllegalTransition,
    ResumeIntent,
    SkipIntent,
    SnapshotIntent,
    check,
    decide_intent,
    plan_resume,
    relaunch,
)
from ftrain.events.schema import (
    Actor,
    AnyEvent,
    Checkpointed,
    CorruptSkipped,
    Failed,
    Resumed,
    Snapshotted,
    decode_event,
    encode_event,
)
from tests.support.builders import T0, fold
from tests.unit.test_judge_rules import RUN, ckpt, launched

FAILED = Failed(run_id=RUN, reason="node-failure", attempt=1)


def snap(step: int, *, attempt: int = 1) -> Snapshotted:
    return Snapshotted(run_id=RUN, step=step, epoch=0, shards=2, uri=f"file:///dev/shm/s{step}",
                       checkpoint_hash=f"{step + 1000:064x}", size_bytes=10, attempt=attempt)  # fmt: skip


def durable(step: int) -> Checkpointed:
    return msgspec.structs.replace(ckpt(step), attempt=1)


def from_memory(seq: int, step: int, *, attempt: int = 2, count: int = 1) -> Resumed:
    return Resumed(run_id=RUN, checkpoint_seq=seq, step=step, epoch=0, uri="", resume_count=count,
                   checkpoint_hash=f"{step + 1000:064x}", attempt=attempt, tier="memory")  # fmt: skip


def refused(events: tuple[AnyEvent, ...], event: AnyEvent, message: str) -> None:
    with pytest.raises(IllegalTransition, match=f"^{re.escape(message)}$"):
        check(fold(*events), event)


def test_a_snapshot_never_moves_the_durable_tier_step_checkpoints_or_retention() -> None:
    state = fold(launched(), durable(20), snap(25), snap(30))
    assert (state.step, [c.step for c in state.checkpoints]) == (20, [20])
    assert state.snapshot is not None and state.snapshot.recorded.step == 30
    check(state, durable(40))  # a snapshot recorded late never blocks the durable tier's next step
    check(fold(launched(), durable(20), snap(45)), durable(40))
    assert (
        plan_resume(fold(launched(), durable(20), snap(25), FAILED), [], forced=False).candidates[0].step
        == 20
    )


def test_each_snapshot_advances_until_the_run_resumes_and_then_snapshots_again() -> None:
    refused(
        (launched(), snap(30)),
        snap(30),
        f"run {RUN} has a memory snapshot of step 30; step 30 does not advance it",
    )
    reopened = (
        launched(),
        durable(20),
        snap(30),
        FAILED,
        relaunch(fold(launched(), durable(20), snap(30), FAILED)),
    )
    check(fold(*reopened), snap(25, attempt=2))
    in_place = Resumed(run_id=RUN, checkpoint_seq=2, step=20, epoch=0, uri="u20", checkpoint_hash=f"{20:064x}",
                       resume_count=1, attempt=1)  # fmt: skip
    check(fold(launched(), durable(20), snap(30), in_place), snap(25))  # torchrun restarted it in place


def test_a_snapshot_follows_the_attempt_fence() -> None:
    refused(
        (launched(), durable(20)),
        snap(25, attempt=3),
        f"run {RUN} is in attempt 1; an event of attempt 3 is refused",
    )
    refused(
        (launched(), FAILED), snap(25), f"run {RUN} is failed; it cannot be snapshotted (resume it first)"
    )


def test_the_memory_candidate_is_the_newest_valid_snapshot_beyond_every_durable_checkpoint() -> None:
    assert fold(launched(), durable(20), snap(25)).memory_candidate() is not None
    assert fold(launched(), snap(15), durable(20)).memory_candidate() is None, "durable is as near"
    assert fold(launched(), durable(20)).memory_candidate() is None
    corrupt = CorruptSkipped(run_id=RUN, checkpoint_seq=3, step=25, uri="", reason="bad", tier="memory")
    assert fold(launched(), durable(20), snap(25), corrupt).memory_candidate() is None


def test_a_relaunch_opens_from_durable_and_the_trainer_continues_it_from_memory() -> None:
    before = (launched(), durable(20), snap(25), snap(30), FAILED)
    opened = relaunch(fold(*before))
    assert (opened.step, opened.tier) == (20, msgspec.UNSET)
    state = fold(*before, opened, from_memory(4, 30, count=2))
    assert (state.step, state.attempt, state.resume_count, state.status) == (30, 2, 2, "running")


@pytest.mark.parametrize(
    ("events", "resume", "message"),
    [
        ((durable(20), snap(25), snap(30), FAILED), from_memory(3, 25),
         f"run {RUN} must resume from memory only from its newest valid snapshot newer than its durable "
         "checkpoints, not seq 3"),
        ((snap(25), durable(30), FAILED), from_memory(2, 25),
         f"run {RUN} must resume from memory only from its newest valid snapshot newer than its durable "
         "checkpoints, not seq 2"),
        ((durable(20), snap(25), FAILED), msgspec.structs.replace(from_memory(3, 25), step=24),
         "resumed event does not match memory snapshot seq 3"),
        ((durable(20), snap(25), FAILED), msgspec.structs.replace(from_memory(3, 25), checkpoint_hash="0" * 64),
         "resumed event does not match memory snapshot seq 3"),
    ],
)  # fmt: skip
def test_a_resume_from_memory_names_only_the_snapshot_the_log_vouches_for(
    events: tuple[AnyEvent, ...], resume: Resumed, message: str
) -> None:
    refused((launched(), *events), resume, message)


def test_a_corrupt_snapshot_is_refused_against_its_tier_once() -> None:
    skipped = CorruptSkipped(run_id=RUN, checkpoint_seq=3, step=25, uri="", reason="bad", tier="memory")
    state = fold(launched(), durable(20), snap(25), FAILED, skipped)
    assert state.snapshot is not None and (state.snapshot.status, state.snapshot.reason) == ("corrupt", "bad")
    assert [c.status for c in state.checkpoints] == ["valid"], "the durable tier is untouched"
    refused((launched(), durable(20), snap(25), FAILED, skipped), skipped,
            f"run {RUN} has no valid memory snapshot at seq 3")  # fmt: skip
    refused((launched(), durable(20), snap(25)), msgspec.structs.replace(skipped, checkpoint_seq=2),
            f"run {RUN} has no valid memory snapshot at seq 2")  # fmt: skip


def test_the_outbox_intents_decide_the_memory_events() -> None:
    at = T0 + timedelta(hours=1)
    state = fold(launched(), durable(20), snap(25), FAILED)
    assert decide_intent(state, SnapshotIntent(snapshotted=snap(25)), "i", at) is None, "already in the log"
    event = decide_intent(
        state, ResumeIntent(checkpoint_hash=f"{1025:064x}", step=25, attempt=2, tier="memory"), "i", at
    )
    assert isinstance(event, Resumed) and (event.checkpoint_seq, event.tier, event.uri) == (
        3,
        "memory",
        snap(25).uri,
    )
    check(state, event)
    skip = decide_intent(
        state, SkipIntent(checkpoint_hash=f"{1025:064x}", step=25, reason="bad", tier="memory"), "i", at
    )
    assert isinstance(skip, CorruptSkipped) and (skip.checkpoint_seq, skip.tier) == (3, "memory")
    unknown = decide_intent(
        state, SkipIntent(checkpoint_hash="f" * 64, step=25, reason="bad", tier="memory"), "i", at
    )
    assert isinstance(unknown, CorruptSkipped) and unknown.checkpoint_seq == 0  # for the judge to refuse
    with pytest.raises(IllegalTransition):
        check(state, unknown)


def test_a_resume_served_by_a_peers_replica_is_the_snapshots_as_from_memory() -> None:
    at = T0 + timedelta(hours=1)
    state = fold(launched(), durable(20), snap(25), FAILED)
    intent = ResumeIntent(checkpoint_hash=f"{1025:064x}", step=25, attempt=2, tier="peer")
    event = decide_intent(state, intent, "i", at)
    assert isinstance(event, Resumed) and (event.checkpoint_seq, event.tier) == (3, "peer")
    check(state, event)
    assert decode_event(encode_event(event)) == event
    refused((launched(), durable(20), snap(25), snap(30), FAILED), msgspec.structs.replace(event, step=25),
            f"run {RUN} must resume from memory only from its newest valid snapshot newer than its durable "
            "checkpoints, not seq 3")  # fmt: skip
    skip = decide_intent(
        state, SkipIntent(checkpoint_hash=f"{1025:064x}", step=25, reason="bad", tier="peer"), "i", at
    )
    assert isinstance(skip, CorruptSkipped) and (skip.checkpoint_seq, skip.tier) == (3, "peer")
    skipped = fold(launched(), durable(20), snap(25), FAILED, skip)
    assert skipped.snapshot is not None and skipped.snapshot.status == "corrupt"
    assert skipped.memory_candidate() is None, "a snapshot corrupt from a peer is not tried again"


def test_a_log_from_before_the_tier_reads_and_folds_as_before() -> None:
    old_resumed = b'{"type":"resumed","run_id":"r","checkpoint_seq":2,"step":20,"epoch":0,"uri":"u20",'
    old_resumed += b'"checkpoint_hash":"' + f"{20:064x}".encode() + b'","resume_count":1}'
    old_skip = (
        b'{"type":"corrupt_skipped","run_id":"r","checkpoint_seq":2,"step":20,"uri":"u20","reason":"x"}'
    )
    resumed, skipped = decode_event(old_resumed), decode_event(old_skip)
    assert isinstance(resumed, Resumed) and resumed.tier is msgspec.UNSET
    assert isinstance(skipped, CorruptSkipped) and skipped.tier is msgspec.UNSET
    state = fold(launched(), durable(20), skipped)
    assert state.snapshot is None and [c.status for c in state.checkpoints] == ["corrupt"]
    assert b'"tier"' not in encode_event(msgspec.structs.replace(resumed, seq=3)), "unset stays absent"


def test_status_and_the_timeline_show_the_newest_snapshot() -> None:
    actor = Actor(user="u", host="node-a", pid=1, rank=0)
    state = fold(launched(), durable(20), msgspec.structs.replace(snap(25), actor=actor))
    lines = render.status(state, T0 + timedelta(hours=1))
    assert (
        f"memory      step 25 epoch 0 on node-a, 10 bytes (hash {render.short_hash(f'{1025:064x}')})" in lines
    )
    document = status_document(state)["memory_snapshot"]
    assert (document["step"], document["host"], document["status"]) == (25, "node-a", "valid")
    assert status_document(fold(launched(), durable(20)))["memory_snapshot"] is None
    assert render.summary(snap(25)).startswith("step 25 epoch 0 hash ")
    assert render.summary(from_memory(3, 25)) == "#1 from step 25 from memory"
