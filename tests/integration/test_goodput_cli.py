"""`ftrain status` and `ftrain cost --run` show a run's goodput, read back from a real nats-server: the
timelines of `tests/unit/test_goodput.py`, stored with their own stamps, then asked for through the CLI."""

import asyncio
import json
import uuid

import msgspec
import pytest

from ftrain.events.chain import ChainHead
from ftrain.events.jetstream.nats_server import ServerProcess
from ftrain.events.record import run_subject
from ftrain.events.schema import AnyEvent
from ftrain.service import RunService
from tests.integration.test_failures import raw_publish
from tests.support.cli import Cli
from tests.unit.test_goodput import RUN, Log, failed_and_resumed


def store(env: dict[str, str], events: list[AnyEvent]) -> None:
    """Append `events` as they are, their times included (an event with an id keeps its stamps)."""

    async def go() -> None:
        async with RunService.open(env) as app:
            head = ChainHead()
            for event in events:
                head = (
                    await app.store.append(msgspec.structs.replace(event, id=uuid.uuid4().hex), head)
                ).head

    asyncio.run(go())


def old_log() -> Log:
    """The same run as a trainer from before goodput would have recorded it."""
    log = Log()
    log.save(10, 12, attempt=0)
    newest = log.save(20, 19, attempt=0)
    log.fail(22.4, attempt=0)
    log.resume(newest, 25, attempt=0, count=1)
    log.save(30, 37, attempt=0)
    log.complete(38, attempt=0)
    return log


def test_status_shows_one_goodput_line_and_cost_the_breakdown(cli: Cli, env: dict[str, str]) -> None:
    store(env, failed_and_resumed().events)
    status = cli.ok("status", RUN)
    assert [line for line in status if line.startswith("goodput ")] == [
        "goodput     47.4 % (18.0 s productive of 38.0 s wall)"
    ]
    assert "supervisor  none leased" in status  # a log written by hand: no `ftrain run` ever held it
    assert status[-1].startswith("chain head  seq 7 ")
    assert cli.ok("cost", "--run", RUN) == [
        f"Goodput of {RUN} (completed): 47.4 % of its wall time trained steps it kept",
        "TERM              TIME    SHARE    WHAT",
        "wall time         38.0 s  100.0 %  launched → completed",
        "productive        18.0 s  47.4 %   training time of the steps the run kept",
        "checkpoint stall  3.0 s   7.9 %    3 save(s) holding the training loop",
        "start-up          5.0 s   13.2 %   launched → the first training step",
        "restart           5.0 s   13.2 %   1 restart(s): resumed → training again",
        "down              2.6 s   6.8 %    1 failure(s): failed → resumed",
        "recomputed        2.4 s   6.3 %    4 step(s) lost × 0.600 s a step",
        "other             2.0 s   5.3 %    teardown after failures, work after the newest checkpoint, estimates' error",
        "GPU-hours 1.00 over 1 GPU(s) (reported)",
    ]


def test_the_json_outputs_carry_every_term_in_seconds(cli: Cli, env: dict[str, str]) -> None:
    store(env, failed_and_resumed().events)
    expected = {
        "ratio": round(18 / 38, 6), "wall_seconds": 38.0, "productive_seconds": 18.0,
        "checkpoint_stall_seconds": 3.0, "startup_seconds": 5.0, "restart_seconds": 5.0, "down_seconds": 2.6,
        "recomputed_seconds": 2.4, "other_seconds": 2.0, "unknown": [], "attempts": 2, "failures": 1,
        "saves": 3, "lost_steps": 4, "step_seconds": 0.6, "recomputed_estimated": True,
        "lost_steps_by_tier": {"durable": 4},
    }  # fmt: skip
    cost = json.loads(cli.ok("cost", "--run", RUN, "--json")[0])
    assert cost == {"run_id": RUN, "state": "completed", "gpus": 1, "gpu_hours": 1.0, "cost_hours": 1.0,
                    "cost_unit": "GPU-hours", "source": "reported", "goodput": expected, "broken": None}  # fmt: skip
    assert json.loads(cli.ok("status", RUN, "--json")[0])["goodput"] == expected


def test_lost_steps_the_trainer_timed_show_as_timed_not_priced(cli: Cli, env: dict[str, str]) -> None:
    log = failed_and_resumed()
    log.events[-2] = msgspec.structs.replace(log.events[-2], lost_seconds=3.1)
    store(env, log.events)
    assert "recomputed        3.1 s   8.2 %    4 step(s) lost, timed by the attempts that ran them" in (
        cli.ok("cost", "--run", RUN)
    )
    assert json.loads(cli.ok("status", RUN, "--json")[0])["goodput"]["recomputed_estimated"] is False


def test_an_old_log_shows_what_it_cannot_tell_as_unknown(cli: Cli, env: dict[str, str]) -> None:
    store(env, old_log().events)
    assert [line for line in cli.ok("status", RUN) if line.startswith("goodput ")] == [
        "goodput     unknown (38.0 s wall; its events do not say how long training took)"
    ]
    assert cli.ok("cost", "--run", RUN)[:-1] == [
        f"Goodput of {RUN} (completed): unknown of its wall time trained steps it kept",
        "TERM              TIME     SHARE    WHAT",
        "wall time         38.0 s   100.0 %  launched → completed",
        "productive        unknown  —        training time of the steps the run kept",
        "checkpoint stall  unknown  —        3 save(s) holding the training loop",
        "start-up          unknown  —        launched → the first training step",
        "restart           unknown  —        1 restart(s): resumed → training again",
        "down              2.6 s    6.8 %    1 failure(s): failed → resumed",
        "recomputed        unknown  —        unknown step(s) lost × unknown a step",
        "other             35.4 s   93.2 %   teardown after failures, work after the newest checkpoint, "
        "estimates' error; includes the unknown productive, checkpoint stall, start-up, restart, recomputed",
    ]
    doc = json.loads(cli.ok("cost", "--run", RUN, "--json")[0])["goodput"]
    assert doc["unknown"] == ["productive", "checkpoint_stall", "startup", "restart", "recomputed"]
    assert (doc["ratio"], doc["productive_seconds"], doc["down_seconds"]) == (None, None, 2.6)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("cost", "P", "--run", RUN),
            "ftrain cost: error: argument --run: not allowed with argument project",
        ),
        (("cost", "--run", "a b"), "ftrain cost: error: argument --run: "),
    ],
)
def test_bad_input_is_one_line_exit_2(
    cli: Cli, env: dict[str, str], args: tuple[str, ...], message: str
) -> None:
    store(env, failed_and_resumed().events)
    code, out, err = cli(*args)
    assert (code, out) == (2, "") and err.startswith(message) and err.count("\n") == 1


def test_a_broken_run_shows_its_break_first_and_the_goodput_as_far_as_it_holds_exit_1(
    cli: Cli, env: dict[str, str], server: ServerProcess
) -> None:
    store(env, failed_and_resumed().events)
    seq = asyncio.run(raw_publish(server, run_subject(RUN, "failed"), b"not an event"))
    code, out, _ = cli("cost", "--run", RUN)  # stderr: the projector's warning about the break
    lines = out.splitlines()
    assert code == 1
    assert lines[0].startswith(f"BROKEN run {RUN}: ") and f"stream seq {seq}" in lines[0]
    assert lines[1] == f"Goodput of {RUN} (completed): 47.4 % of its wall time trained steps it kept"
    code, out, _ = cli("cost", "--run", RUN, "--json")
    doc = json.loads(out)
    assert (code, doc["state"], doc["broken"]["stream_seq"], doc["goodput"]["ratio"]) == (
        1,
        "broken",
        seq,
        0.473684,
    )
