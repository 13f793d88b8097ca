"""A command decides against its run's own log, read through the command handler, and nothing else: the read
model is the queries' to catch up (issue 33: `checkpoint` read its run through the SQLite catch-up and then
again through the run's own subject)."""

import asyncio

import pytest

from ftrain.errors import Refused
from ftrain.events.jetstream.server import ServerProcess
from ftrain.service import RunService
from tests.integration.test_failures import checkpoint, launch, launch_maker, raw_publish
from tests.support.cli import Cli
from tests.support.cli import launch as launch_run


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


def test_a_run_whose_first_record_is_forged_is_refused_by_its_break(server: ServerProcess, cli: Cli) -> None:
    """The run's own log holds a break and no accepted event: each command that appends names the break as
    `status` (the read model's view) does, the resume refuses to act on it, and nothing is appended."""
    launch_run(cli)  # the stream exists
    asyncio.run(raw_publish(server, "ftrain.run.forged.launched", b"not an event"))
    code, out, _ = cli("status", "forged")
    assert code == 1 and out.startswith("BROKEN run forged: ")
    broken = f"run forged's log is broken: {out.removeprefix('BROKEN ').rstrip()}"
    last = cli.last_seq()
    for argv in (["fail", "forged"], ["complete", "forged"],
                 ["checkpoint", "forged", "--step", "1", "--epoch", "0", "--shards", "1", "--state", "{}"]):  # fmt: skip
        assert cli(*argv) == (1, "", f"ftrain {argv[0]}: {broken}\n")
    code, out, err = cli("resume", "forged")
    assert (code, out) == (1, "")
    assert err.startswith("ftrain resume: run forged's log is broken, refusing to act on it: run forged: ")
    assert cli.last_seq() == last
    assert not (cli.storage() / "forged").exists()
