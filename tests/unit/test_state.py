"""The run state machine, pure: which transitions are legal and what each one changes."""

import re
from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from ftrain.domain.lifecycle import (
    IllegalTransition,
    ResumeIntent,
    RunState,
    apply,
    decide_intent,
    relaunch,
    restart_event,
)
from ftrain.events.chain import ChainHead
from ftrain.events.schema import AnyEvent, Checkpointed, Completed, CorruptSkipped, Failed, Launched, Resumed

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(event: AnyEvent, seq: int, minutes: float) -> AnyEvent:
    return msgspec.structs.replace(event, seq=seq, time=T0 + timedelta(minutes=minutes))


def launched() -> Launched:
    return Launched(
        run_id="r", project="p", strategy="fsdp", nodes=2, gpus_per_node=4, hosts=("a", "b"),
        allocation_source="nodelist", rdzv_endpoint="a:29500", command=("torchrun",), storage="file:///s",
    )  # fmt: skip


def ckpt(step: int) -> Checkpointed:
    return Checkpointed(run_id="r", step=step, epoch=step // 100, shards=2, uri=f"u{step}", checkpoint_hash=f"h{step}",
                        size_bytes=10)  # fmt: skip


def fold(*events: AnyEvent) -> RunState:
    state: RunState | None = None
    for i, event in enumerate(events, start=1):
        state = apply(state, at(event, i, minutes=10 * i), ChainHead(i, f"hash{i}", i))
    assert state is not None
    return state


def resumed_from(seq: int, step: int, count: int = 1, forced: bool = False) -> Resumed:
    return Resumed(run_id="r", checkpoint_seq=seq, step=step, epoch=step // 100, uri=f"u{step}",
                   checkpoint_hash=f"h{step}", resume_count=count, forced=forced)  # fmt: skip


def test_full_lifecycle_folds_step_resumes_failures_and_wall_time() -> None:
    state = fold(launched(), ckpt(500), ckpt(1000), Failed(run_id="r", reason="preempted"),
                 CorruptSkipped(run_id="r", checkpoint_seq=3, step=1000, uri="u1000", reason="hash mismatch"),
                 resumed_from(2, 500), ckpt(600))  # fmt: skip
    assert (state.status, state.step, state.resume_count, state.failures) == ("running", 600, 1, 1)
    assert [(c.step, c.status) for c in state.checkpoints] == [
        (500, "valid"),
        (1000, "corrupt"),
        (600, "valid"),
    ]
    assert [c.step for c in state.valid_checkpoints()] == [600, 500]
    # running 10→40 min (launched at 10, failed at 40), then again from 60 (resumed)
    assert state.running_seconds == 30 * 60
    assert state.running_seconds_at(T0 + timedelta(minutes=90)) == 60 * 60
    assert state.gpu_hours_at(T0 + timedelta(minutes=90)) == pytest.approx(8.0)
    assert state.head == ChainHead(7, "hash7", 7)


def test_completed_records_reported_cost_and_nothing_may_follow() -> None:
    completed = Completed(run_id="r", cost_gpu_hours=12.5, running_seconds=60, cost_source="reported")
    running = fold(launched(), ckpt(100))
    done = fold(launched(), ckpt(100), completed)
    assert (done.status, done.gpu_hours_at(T0), done.cost_source) == ("completed", 12.5, "reported")
    # each probe is legal on the run before it completed, so only the completion rule can refuse it
    for event in (ckpt(200), Failed(run_id="r", reason="oom"), resumed_from(2, 100, forced=True), completed):
        apply(running, at(event, 3, 30), ChainHead(3, "x", 3))
        with pytest.raises(IllegalTransition, match=r"^run r is completed; nothing may follow completion$"):
            apply(done, at(event, 4, 40), ChainHead(4, "x", 4))
    with pytest.raises(IllegalTransition, match=r"^run r already exists \(completed\)$"):  # nor a new launch
        apply(done, at(launched(), 4, 40), ChainHead(4, "x", 4))


@pytest.mark.parametrize(
    ("history", "event", "message"),
    [
        ((), ckpt(1), "run r does not exist; it cannot be checkpointed"),
        ((launched(),), launched(), "run r already exists (running)"),
        ((launched(), ckpt(500)), ckpt(500), "run r is at step 500; checkpoint step 500 does not advance it"),
        ((launched(), ckpt(500)), ckpt(400), "does not advance it"),
        ((launched(), Failed(run_id="r", reason="oom")), ckpt(1), "run r is failed; it cannot be checkpointed"),
        ((launched(), Failed(run_id="r", reason="oom")), Failed(run_id="r", reason="oom"), "run r is failed"),
        ((launched(), ckpt(5)), resumed_from(2, 5), "run r is running; resume follows a failure"),
        ((launched(), ckpt(5), ckpt(6), Failed(run_id="r", reason="x")), resumed_from(2, 5), "newest valid"),
        ((launched(), ckpt(5), Failed(run_id="r", reason="x")), resumed_from(2, 5, count=2), "resume count must be 1"),
        ((launched(), ckpt(5), Failed(run_id="r", reason="x")),
         CorruptSkipped(run_id="r", checkpoint_seq=9, step=5, uri="u", reason="x"), "no valid checkpoint at seq 9"),
        ((launched(), Failed(run_id="r", reason="x")),
         Completed(run_id="r", cost_gpu_hours=1, running_seconds=1, cost_source="reported"), "resume it first"),
    ],
)  # fmt: skip
def test_illegal_transitions_name_the_current_state(
    history: tuple[AnyEvent, ...], event: AnyEvent, message: str
) -> None:
    state = fold(*history) if history else None
    with pytest.raises(IllegalTransition, match=re.escape(message)):
        apply(state, at(event, len(history) + 1, 99), ChainHead())


def test_forced_resume_from_running_and_first_checkpoint_at_step_zero() -> None:
    state = fold(launched(), ckpt(0), resumed_from(2, 0, forced=True))
    assert (state.status, state.resume_count, state.step) == ("running", 1, 0)
    with pytest.raises(IllegalTransition, match="does not advance"):
        apply(state, at(ckpt(0), 4, 99), ChainHead())


def test_a_run_that_never_checkpointed_restarts_from_step_zero_and_no_other_may() -> None:
    failed = fold(launched(), Failed(run_id="r", reason="preempted"))
    restarted = apply(failed, at(restart_event(failed, forced=False), 3, 99), ChainHead())
    assert (restarted.status, restarted.step, restarted.resume_count) == ("running", 0, 1)
    assert (
        fold(launched(), Failed(run_id="r", reason="x"), restart_event(failed, forced=False), ckpt(5)).step
        == 5
    )

    lost_all = fold(launched(), ckpt(5), Failed(run_id="r", reason="x"),
                    CorruptSkipped(run_id="r", checkpoint_seq=2, step=5, uri="u5", reason="hash mismatch"))  # fmt: skip
    with pytest.raises(IllegalTransition, match="never from step 0"):
        apply(lost_all, at(restart_event(lost_all, forced=False), 5, 99), ChainHead())
    naming = msgspec.structs.replace(restart_event(failed, forced=False), uri="u5")
    with pytest.raises(IllegalTransition, match="names no checkpoint"):
        apply(failed, at(naming, 3, 99), ChainHead())


# -- attempts: epochs in the log ------------------------------------------------------------------------------


def stamped(event: AnyEvent, attempt: int) -> AnyEvent:
    return msgspec.structs.replace(event, attempt=attempt)


def test_attempts_open_with_launched_and_resumed_and_old_logs_still_fold() -> None:
    legacy = fold(launched(), ckpt(5), Failed(run_id="r", reason="x"), resumed_from(2, 5), ckpt(10))
    assert (legacy.attempt, legacy.fenced, legacy.step) == (2, False, 10)

    state = fold(launched(), stamped(ckpt(5), 1), stamped(Failed(run_id="r", reason="x"), 1),
                 stamped(resumed_from(2, 5), 2), stamped(ckpt(10), 2))  # fmt: skip
    assert (state.attempt, state.fenced, state.step, state.resumed_in) == (2, True, 10, 2)


@pytest.mark.parametrize(
    "late",
    [stamped(ckpt(15), 1), ckpt(15), stamped(Failed(run_id="r", reason="x"), 1),
     stamped(Completed(run_id="r", cost_gpu_hours=1, running_seconds=1, cost_source="reported"), 1)],
)  # fmt: skip
def test_an_older_attempts_late_events_are_refused_and_never_touch_the_live_attempt(late: AnyEvent) -> None:
    live = fold(launched(), stamped(ckpt(5), 1), stamped(Failed(run_id="r", reason="x"), 1),
                stamped(resumed_from(2, 5), 2))  # fmt: skip
    with pytest.raises(
        IllegalTransition, match=r"^run r is in attempt 2; an event of attempt [01] is refused$"
    ):
        apply(live, at(late, 5, 99), ChainHead())
    assert apply(live, at(stamped(ckpt(15), 2), 5, 99), ChainHead()).step == 15


def test_a_relaunch_opens_the_next_attempt_once_and_a_resume_within_it_stays_in_it() -> None:
    failed = fold(
        launched(), stamped(ckpt(5), 1), stamped(ckpt(10), 1), stamped(Failed(run_id="r", reason="x"), 1)
    )
    opened = relaunch(failed)
    assert (opened.attempt, opened.step, opened.resume_count) == (2, 10, 1)
    running = apply(failed, at(opened, 5, 99), ChainHead())
    with pytest.raises(IllegalTransition, match="is running \\(another supervisor\\?\\)"):
        relaunch(running)  # the second of two racing relaunches decides against the winner's state
    # the trainer that loaded step 10 records nothing more; one that had to fall back records it, in attempt 2
    assert decide_intent(running, ResumeIntent(checkpoint_hash="h10", step=10, attempt=2), "i", T0) is None
    skipped = apply(running, at(CorruptSkipped(run_id="r", checkpoint_seq=3, step=10, uri="u10", reason="bad"), 6, 99),
                    ChainHead())  # fmt: skip
    fallback = decide_intent(skipped, ResumeIntent(checkpoint_hash="h5", step=5, attempt=2), "i", T0)
    assert isinstance(fallback, Resumed) and fallback.attempt == 2
    assert apply(skipped, at(fallback, 7, 99), ChainHead()).attempt == 2
    with pytest.raises(IllegalTransition, match="attempt 4 cannot resume it"):
        apply(skipped, at(stamped(fallback, 4), 7, 99), ChainHead())


def test_an_elastic_relaunch_names_its_nodes_and_costs_each_stretch_at_its_own_world() -> None:
    """Launched on a and b (2 × 4 GPUs), b lost: the attempt opened on a alone holds 4 GPUs from then on."""
    lost = Failed(run_id="r", reason="node-failure", message="node b lost", attempt=1)
    on_a = msgspec.structs.replace(resumed_from(2, 500), attempt=2, hosts=("a",))
    state = fold(
        launched(), ckpt(500), lost, on_a, msgspec.structs.replace(ckpt(600), attempt=2)
    )  # minutes 10 … 50
    assert (state.nodes, state.gpus, state.attempt) == (("a",), 4, 2)
    assert state.gpu_hours_at(T0 + timedelta(minutes=60)) == pytest.approx((20 * 8 + 20 * 4) / 60)
    stored_before = msgspec.structs.replace(
        fold(launched(), ckpt(500)), gpu_seconds=None
    )  # an older ftrain's
    assert stored_before.gpu_hours_at(T0 + timedelta(minutes=40)) == pytest.approx(30 * 8 / 60)


def test_an_attempt_names_each_node_once_and_may_run_on_more_than_were_launched() -> None:
    """A relaunch on more nodes (`ftrain run --run-id R --nodes 3` after a 2-node launch) is a world change like
    a shrink: its world is its nodes × the launch's processes per node."""
    failed = fold(launched(), ckpt(500), Failed(run_id="r", reason="node-failure", attempt=1))
    opening = msgspec.structs.replace(resumed_from(2, 500), attempt=2, hosts=("a", "a"))
    with pytest.raises(IllegalTransition, match=re.escape("run r: an attempt names each of its nodes once")):
        apply(failed, opening, ChainHead(4, "h4", 4))
    grown = apply(failed, msgspec.structs.replace(opening, hosts=("a", "b", "c")), ChainHead(4, "h4", 4))
    assert (grown.nodes, grown.gpus) == (("a", "b", "c"), 3 * failed.launch.gpus_per_node)


def test_a_trainer_continuing_its_attempt_keeps_its_nodes() -> None:
    state = fold(launched(), ckpt(500), ckpt(600), Failed(run_id="r", reason="node-failure", attempt=1),
                 msgspec.structs.replace(resumed_from(3, 600), attempt=2, hosts=("b",)),
                 CorruptSkipped(run_id="r", checkpoint_seq=3, step=600, uri="u600", reason="hash mismatch"))  # fmt: skip
    fallback = Resumed(run_id="r", checkpoint_seq=2, step=500, epoch=5, uri="u500", checkpoint_hash="h500",
                       resume_count=2, attempt=2)  # fmt: skip
    assert apply(state, fallback, ChainHead(7, "h7", 7)).nodes == ("b",)
    with pytest.raises(IllegalTransition, match="an attempt keeps its nodes"):
        apply(state, msgspec.structs.replace(fallback, hosts=("a",)), ChainHead(7, "h7", 7))


def test_the_steps_a_checkpointed_retires_are_pruned_never_valid_and_a_corrupt_one_stays_corrupt() -> None:
    retiring = msgspec.structs.replace(ckpt(400), retired=(100, 200, 999))
    skipped = CorruptSkipped(run_id="r", checkpoint_seq=3, step=200, uri="u200", reason="hash mismatch")
    state = fold(launched(), ckpt(100), ckpt(200), Failed(run_id="r", reason="oom"), skipped,
                 resumed_from(2, 100), ckpt(300), retiring)  # fmt: skip
    assert [(c.step, c.status) for c in state.checkpoints] == [
        (100, "pruned"),
        (200, "corrupt"),
        (300, "valid"),
        (400, "valid"),
    ], "a step it never recorded (999) is ignored"
    assert [c.step for c in state.valid_checkpoints()] == [400, 300]


def test_a_log_from_before_retention_named_its_steps_still_reads_every_checkpoint_valid() -> None:
    old = msgspec.json.decode(msgspec.json.encode(ckpt(200)), type=Checkpointed)  # no `retired` member
    assert b"retired" not in msgspec.json.encode(old)
    state = fold(launched(), ckpt(100), old)
    assert [c.status for c in state.checkpoints] == ["valid", "valid"]
