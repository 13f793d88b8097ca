"""A command decides against its run's own log, read through the command handler, and nothing else: the read
model is the queries' to catch up (issue 33: `checkpoint` read its run through the SQLite catch-up and then
again through the run's own subject). Over the in-process log; its refusals' words on a real server:
tests/integration/test_command_refusals.py."""

import pytest

from ftrain.errors import Refused
from ftrain.service import RunService
from tests.support.runs import checkpoint, launch, launch_maker


async def test_every_command_leaves_the_read_model_to_the_queries(app: RunService) -> None:
    run = "own-log"
    await launch(app, run)
    await checkpoint(app, run, 100)
    await app.fail(run, reason="preempted", exit_code=None)
    outcome = await app.resume(run)
    await app.complete(run, cost_gpu_hours=1.0)
    assert outcome.state is not None and outcome.state.status == "running"  # folded from the run's own log
    assert await app.model.run(run) is None  # no command caught the read model up
    assert (await app.state_of(run)).status == "completed"  # the first query does


async def test_launch_takes_the_first_id_whose_own_log_is_empty(app: RunService) -> None:
    await launch(app, "picked")
    again = await app.launch(launch_maker(), lambda: ["picked", "picked-2"])
    assert again.run_id == "picked-2"
    with pytest.raises(Refused, match=r"^run picked already exists$"):
        await app.launch(launch_maker(), lambda: ["picked", "picked-2"])
    assert await app.model.run("picked-2") is None
