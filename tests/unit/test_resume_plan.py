"""The resume plan and the relaunch decider, pure: what the CLI and the trainer both execute."""

import msgspec
import pytest

from ftrain.domain.lifecycle import (
    Candidate,
    IllegalTransition,
    OnDisk,
    ResumePlan,
    check_relaunch,
    plan_resume,
)
from ftrain.events.schema import Checkpointed, Completed, CorruptSkipped, Failed
from tests.unit.test_state import ckpt, fold, launched


def disk(step: int, digest: str | None = None) -> OnDisk:
    return OnDisk(step, f"u{step}", digest or f"h{step}")


def test_a_failed_run_tries_its_valid_checkpoints_newest_first_with_the_logs_digests() -> None:
    state = fold(launched(), ckpt(500), ckpt(1000), Failed(run_id="r", reason="preempted"))
    plan = plan_resume(state, [disk(1000, "forged"), disk(500)])
    assert [(c.step, c.uri, c.digest) for c in plan.candidates] == [
        (1000, "u1000", "h1000"),
        (500, "u500", "h500"),
    ]
    assert [c.ref.seq for c in plan.candidates if c.ref] == [3, 2]
    assert (plan.unrecorded, plan.superseded, plan.had_checkpoints, plan.restart) == ((), (), True, False)


def test_a_skipped_checkpoint_is_no_candidate_but_still_counts_as_had() -> None:
    skipped = CorruptSkipped(run_id="r", checkpoint_seq=2, step=500, uri="u500", reason="hash mismatch")
    state = fold(launched(), ckpt(500), Failed(run_id="r", reason="oom"), skipped)
    plan = plan_resume(state, [])
    assert (plan.candidates, plan.had_checkpoints, plan.restart) == ((), True, False)


def test_a_complete_directory_newer_than_anything_recorded_is_set_aside_not_trusted() -> None:
    state = fold(launched(), ckpt(500), Failed(run_id="r", reason="preempted"))
    stray = OnDisk(600, "u600", "h600")
    older_unknown = OnDisk(
        400, "elsewhere", "h400"
    )  # older than the newest recorded: not this plan's to judge
    plan = plan_resume(state, [stray, disk(500), older_unknown])
    assert plan.unrecorded == (stray,)
    assert [c.step for c in plan.candidates] == [500]


def test_a_failed_run_that_never_checkpointed_restarts_from_step_0() -> None:
    state = fold(launched(), Failed(run_id="r", reason="preempted"))
    assert plan_resume(state, []) == ResumePlan(restart=True)


def test_an_in_place_restart_of_a_running_run_counts_as_its_failure() -> None:
    running = fold(launched())
    assert plan_resume(running, [], failed_in_place=True).restart
    assert not plan_resume(running, [], forced=True).restart


def test_a_running_run_resumes_only_when_forced_and_a_completed_one_never() -> None:
    running = fold(launched(), ckpt(100))
    with pytest.raises(
        IllegalTransition, match=r"^run r is running; resume follows a failure \(or use --force\)$"
    ):
        plan_resume(running, [])
    assert [c.step for c in plan_resume(running, [], forced=True).candidates] == [100]
    completed = fold(
        launched(),
        ckpt(100),
        Completed(run_id="r", cost_gpu_hours=1.0, running_seconds=1.0, cost_source="reported"),
    )
    for kwargs in ({}, {"forced": True}, {"fresh": True}):
        with pytest.raises(IllegalTransition, match=r"^run r is completed; nothing may follow completion$"):
            plan_resume(completed, [], **kwargs)  # type: ignore[arg-type]


def test_fresh_supersedes_the_directories_only_while_the_log_knows_no_checkpoint() -> None:
    failed = fold(launched(), Failed(run_id="r", reason="preempted"))
    plan = plan_resume(failed, [disk(7)], fresh=True)
    assert (plan.superseded, plan.candidates, plan.restart) == ((disk(7),), (), True)
    with pytest.raises(IllegalTransition, match="has checkpoints; --no-resume needs a new --run-id"):
        plan_resume(fold(launched(), ckpt(5)), [], fresh=True)


def test_without_a_log_the_directories_are_the_candidates_with_their_own_markers() -> None:
    plan = plan_resume(None, [disk(20, "m20"), disk(10, None)])
    assert plan.candidates == (Candidate(20, "u20", "m20"), Candidate(10, "u10", "h10"))
    assert plan.had_checkpoints
    assert plan_resume(None, []) == ResumePlan()
    assert plan_resume(None, [disk(3)], fresh=True) == ResumePlan(superseded=(disk(3),))


def test_only_a_failed_run_is_relaunched_and_only_as_itself() -> None:
    same = {"user": "u", "project": "p", "gpus_per_node": 4, "strategy": "fsdp",
            "dataset_revision": None, "checkpoint_policy": None}  # fmt: skip
    check_relaunch(fold(launched(), Failed(run_id="r", reason="oom")), **same)  # type: ignore[arg-type]
    with pytest.raises(IllegalTransition, match=r"^run r is running \(another supervisor\?\)"):
        check_relaunch(fold(launched()), **same)  # type: ignore[arg-type]
    with pytest.raises(IllegalTransition, match="relaunch it with the same project, --gpus-per-node"):
        check_relaunch(fold(launched(), Failed(run_id="r", reason="oom")), **{**same, "gpus_per_node": 8})  # type: ignore[arg-type]


def test_checkpointed_event_is_the_one_descriptor_a_ref_reads() -> None:
    state = fold(launched(), ckpt(500))
    (ref,) = state.checkpoints
    assert isinstance(ref.recorded, Checkpointed)
    assert (ref.seq, ref.step, ref.uri, ref.checkpoint_hash) == (2, 500, "u500", "h500")


def test_a_pruned_checkpoint_is_no_candidate_and_its_leftover_directory_is_named_retired() -> None:
    retiring = msgspec.structs.replace(ckpt(300), retired=(100,))
    state = fold(launched(), ckpt(100), ckpt(200), retiring, Failed(run_id="r", reason="preempted"))
    plan = plan_resume(state, [disk(300), disk(200), disk(100)])
    assert [c.step for c in plan.candidates] == [300, 200], "never tried, never recorded corrupt_skipped"
    assert (plan.retired, plan.unrecorded, plan.had_checkpoints) == ((100,), (), True)


def test_retention_counts_only_what_the_plan_vouches_for_from_the_checkpoint_resumed_back() -> None:
    state = fold(launched(), ckpt(100), ckpt(200), ckpt(300), Failed(run_id="r", reason="preempted"))
    plan = plan_resume(state, [disk(400), disk(300), disk(200), disk(100)])
    assert [d.step for d in plan.unrecorded] == [400]
    assert plan.accepted(300) == [300, 200, 100]
    assert plan.accepted(200) == [200, 100], "300 was refused at resume and set aside"
    assert plan.accepted(None) == []
