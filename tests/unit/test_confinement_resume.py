"""A resume against the run's log refuses a forged checkpoint URI outside the run's directory, reading and moving
nothing of it (the confinement itself, on real files: tests/unit/test_confinement.py)."""

import hashlib
import os
from pathlib import Path

from ftrain.domain.command_handler import RunLog
from ftrain.events.schema import Checkpointed
from ftrain.service import RunService
from ftrain.workers.storage.location import path_uri
from ftrain.workers.storage.storage_errors import OUTSIDE_RUN
from tests.support.runs import checkpoint, launch
from tests.unit.test_confinement import RUN, snapshot, victim


async def test_resume_refuses_a_forged_uri_outside_the_run_unread_and_unmoved(
    app: RunService, env: dict[str, str], tmp_path: Path
) -> None:
    await launch(app, RUN)
    await checkpoint(app, RUN, 10)
    run = Path(env["FTRAIN_STORAGE"]) / RUN
    outside = victim(tmp_path / "attacker")
    linked = victim(tmp_path / "linked", step=30)
    (run / "step-30").symlink_to(linked)  # looks like the run's own, resolves elsewhere
    before = {p: snapshot(p) for p in (outside, linked)}
    for step, target, uri in ((20, outside, path_uri(outside)), (30, linked, path_uri(run / "step-30"))):
        digest = hashlib.sha256((target / "manifest.json").read_bytes()).hexdigest()
        forged = Checkpointed(
            run_id=RUN,
            step=step,
            epoch=0,
            shards=1,
            uri=uri,
            checkpoint_hash=digest,
            size_bytes=10,
            attempt=1,
        )
        assert await RunLog(app.store, RUN).append(lambda _state, e=forged: e) is not None
    await app.fail(RUN, reason="preempted", exit_code=None)

    outcome = await app.resume(RUN)

    assert [(s.step, s.reason) for s in outcome.skipped] == [(30, OUTSIDE_RUN), (20, OUTSIDE_RUN)]
    assert outcome.resumed is not None and outcome.resumed.step == 10
    assert {p: snapshot(p) for p in (outside, linked)} == before, "never renamed, never written"
    assert (run / "step-30").is_symlink() and os.readlink(run / "step-30") == str(linked)
    assert not list(outside.parent.glob("*.corrupt-*")) and not list(run.glob("*.corrupt-*"))
