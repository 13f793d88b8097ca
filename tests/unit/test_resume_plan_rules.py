"""Which directories a resume plan sets aside as unrecorded: exactly those newer than anything the log recorded."""

from ftrain.domain.lifecycle import OnDisk, plan_resume
from tests.unit.test_judge_rules import FAILED, ckpt, fold, launched, restart


def test_after_a_restart_with_no_checkpoint_every_directory_from_step_0_is_unrecorded() -> None:
    state = fold(launched(), FAILED, restart(), FAILED)
    on_disk = [OnDisk(0, "d0", None), OnDisk(1, "d1", None)]
    assert plan_resume(state, on_disk).unrecorded == tuple(on_disk)


def test_a_directory_at_the_newest_recorded_step_is_not_newer_than_it() -> None:
    state = fold(launched(), ckpt(10), FAILED)
    on_disk = [OnDisk(10, "elsewhere/step-10", None), OnDisk(11, "d11", None), OnDisk(10, "u10", None)]
    assert plan_resume(state, on_disk).unrecorded == (OnDisk(11, "d11", None),)
