"""A command's refusals keep their words now that it reads its run's own log only, never the read model
(issue 33; that it never reads the read model: tests/unit/test_commands_own_log.py)."""

import asyncio

from ftrain.events.jetstream.nats_server import ServerProcess
from tests.integration.test_failures import raw_publish
from tests.support.cli import Cli
from tests.support.cli import launch as launch_run


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
