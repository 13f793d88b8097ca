"""Without a log the storage is the run's only record: the steps an earlier start set aside as corrupt are the
evidence that it had checkpoints, so a start that finds no valid one stops instead of training from step 0,
on every later start, until one starts over on purpose (the trial: tests/integration/test_start_up.py)."""

from ftrain.domain.lifecycle import Candidate, OnDisk, ResumePlan, plan_resume
from tests.unit.test_judge_rules import FAILED, fold, launched

ASIDE = ("file:///c/run/step-10.corrupt-1700000000", "file:///c/run/step-5.corrupt-1700000000")


def test_a_run_without_a_log_whose_checkpoints_were_all_set_aside_had_checkpoints() -> None:
    plan = plan_resume(None, [], quarantined=ASIDE)
    assert plan == ResumePlan(had_checkpoints=True, quarantined=ASIDE)
    assert plan_resume(None, []) == ResumePlan(), "nothing there and nothing set aside: a first start"


def test_a_valid_checkpoint_beside_the_evidence_is_still_tried() -> None:
    plan = plan_resume(None, [OnDisk(15, "u15", "h15")], quarantined=ASIDE)
    assert plan.candidates == (Candidate(15, "u15", "h15"),) and plan.had_checkpoints


def test_starting_over_on_purpose_leaves_the_evidence_alone() -> None:
    plan = plan_resume(None, [OnDisk(15, "u15", "h15")], fresh=True, quarantined=ASIDE)
    assert plan == ResumePlan(superseded=(OnDisk(15, "u15", "h15"),))


def test_with_the_log_the_log_alone_says_whether_the_run_had_checkpoints() -> None:
    plan = plan_resume(fold(launched(), FAILED), [], quarantined=ASIDE)
    assert (plan.had_checkpoints, plan.restart, plan.quarantined) == (False, True, ())
