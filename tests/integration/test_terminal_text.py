"""Text a publisher controls, through every human view of the real CLI against a real nats-server: control,
bidirectional and invisible characters come out visibly escaped, so a forged field can neither add a line
(a fake `[ok; signed by …]` verdict), nor hide or reorder the real one; `--json` keeps the strings as stored."""

import asyncio
import json
import os
import re
import subprocess

import msgspec
import pytest

from ftrain.events.chain import seal
from ftrain.events.jetstream.nats_server import ServerProcess
from ftrain.events.record import run_subject
from ftrain.events.schema import Failed, Launched, encode_event, now
from ftrain.service import RunService
from tests.integration.test_failures import MALLORY
from tests.integration.test_progress import ftrain as on_a_terminal
from tests.integration.test_trust import forge, intruder
from tests.support.runs import checkpoint, launch, launch_maker

FORGED_LINE = (
    "#9      2026-12-02 00:00:00  victim  seq 9    failed           preempted  [ok; signed by root@vm]"
)
HOSTILE = f"preempted\n{FORGED_LINE}\r\x1b[8m\u202e\u2066\x85\u2028\ufeff\x7f\x00"
SHOWN = r"preempted\n#9"  # how the start of HOSTILE must read: one line, the newline visible
ESCAPES = (r"\n", r"\r", r"\x1b", r"\u202e", r"\u2066", r"\x85", r"\u2028", r"\ufeff", r"\x7f", r"\x00")
# what must never reach the terminal raw: C0 but the line feed ending each line, DEL, C1, and the
# bidirectional and invisible formatting characters (every one HOSTILE carries is in here)
UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    from tests.support.processes import ftrain_process

    return ftrain_process(list(args), env)


def lines_of(text: str) -> list[str]:
    """The output's lines, split on line feeds only (str.splitlines also splits on \\x85 and U+2028)."""
    assert text.endswith("\n") or text == "", repr(text)
    return text.split("\n")[:-1]


def assert_safe(text: str) -> None:
    for line in lines_of(text):
        assert UNSAFE.search(line) is None, repr(line)


async def hostile_log(app: RunService, server: ServerProcess) -> None:
    """victim: a real launch and checkpoint, then a forged, correctly chained `failed` whose reason and
    message are HOSTILE; ghost: a forged launch whose text fields are; linkbreak: a forged link whose
    prev_hash is, so the chain walk's own finding quotes it."""
    await launch(app, "victim")
    await checkpoint(app, "victim", 10)
    state = await app.state_of("victim")
    await forge(server, state, Failed(run_id="victim", reason=HOSTILE, message=HOSTILE, attempt=state.attempt),
                None)  # fmt: skip
    ghost = msgspec.structs.replace(
        launch_maker("P")("ghost"), project="ghost-\x1b[2J", rdzv_endpoint=f"h:1{HOSTILE}",
        command=("torchrun", HOSTILE), dataset_revision=HOSTILE, seq=1, prev_hash="0" * 64,
        id=os.urandom(16).hex(), time=now(), actor=MALLORY,
    )  # fmt: skip
    assert isinstance(ghost, Launched)
    payload, _ = seal(encode_event(ghost), "0" * 64)
    await launch(app, "linkbreak")
    head = (await app.state_of("linkbreak")).head
    forged = msgspec.structs.replace(
        launch_maker("P")("linkbreak"), seq=head.seq + 1, prev_hash=f"\x1b[8m\r\n{head.hash}",
        id=os.urandom(16).hex(), time=now(), actor=MALLORY,
    )  # fmt: skip
    broken_link, _ = seal(encode_event(forged), forged.prev_hash)
    async with intruder(server) as nc:
        await nc.jetstream().publish(run_subject("ghost", "launched"), payload)
        await nc.jetstream().publish(run_subject("linkbreak", "launched"), broken_link)


@pytest.fixture
async def hostile(app: RunService, server: ServerProcess) -> None:
    await hostile_log(app, server)


@pytest.mark.usefixtures("hostile")
@pytest.mark.parametrize(
    "args",
    [
        ("events", "tail"),
        ("events", "tail", "victim"),
        ("replay",),
        ("replay", "victim"),
        ("status", "victim"),
        ("status", "ghost"),
        ("status", "linkbreak"),
        ("list",),
        ("cost",),
        ("cost", "--run", "victim"),
        ("cost", "--run", "ghost"),
        ("audit", "verify"),
    ],
)
async def test_every_human_view_escapes_what_the_publisher_wrote(
    env: dict[str, str], args: tuple[str, ...]
) -> None:
    done = await asyncio.to_thread(run, env, *args)
    assert done.returncode in (0, 1) and "Traceback" not in done.stderr, done
    assert_safe(done.stdout)
    assert_safe(done.stderr)


async def test_the_forged_line_stays_inside_its_event_and_the_real_verdict_shows(
    hostile: None, env: dict[str, str]
) -> None:
    tail = await asyncio.to_thread(run, env, "events", "tail", "victim")
    lines = lines_of(tail.stdout)
    assert len(lines) == 3 and all(line.startswith("#") for line in lines), lines
    assert SHOWN in lines[2] and lines[2].endswith("[ok; unsigned]"), lines[2]
    assert all(escape in lines[2] for escape in ESCAPES), lines[2]
    replay = lines_of((await asyncio.to_thread(run, env, "replay", "victim")).stdout)
    assert len(replay) == 3 and SHOWN in replay[2]
    status = lines_of((await asyncio.to_thread(run, env, "status", "victim")).stdout)
    assert any(line.startswith("failures    1 (last: preempted\\n#9") for line in status), status
    ghost = lines_of((await asyncio.to_thread(run, env, "status", "ghost")).stdout)
    assert "project ghost-\\x1b[2J" in ghost[1] and "rdzv h:1preempted\\n#9" in ghost[5], ghost


async def test_error_lines_escape_what_the_chain_walk_quotes(hostile: None, env: dict[str, str]) -> None:
    refused = await asyncio.to_thread(run, env, "fail", "linkbreak", "--reason", "preempted")
    assert refused.returncode == 1 and refused.stdout == ""
    *logged, line = lines_of(refused.stderr)  # before it: the projector's warning of the break, as JSON
    assert all(json.loads(entry)["event"] == "chain_break" for entry in logged), logged
    assert line.startswith(
        "ftrain fail: run linkbreak's log is broken, refusing to append: run linkbreak: seq 2 "
    )
    assert "prev_hash \\x1b[8m\\r\\n" in line and line.endswith("… is not 64 hex digits"), line


async def test_log_lines_on_a_terminal_escape_it_too(hostile: None, env: dict[str, str]) -> None:
    """On a terminal, structlog writes key=value lines: the projector's warning quotes the forged prev_hash."""
    code, _, err = await asyncio.to_thread(on_a_terminal, ("status", "linkbreak"), env, terminal=True)
    shown = err.replace("\r\n", "\n")  # the terminal's own line ends
    assert code == 1 and "chain_break" in shown and "prev_hash \\x1b[8m\\r\\n" in shown, shown
    assert_safe(shown)


async def test_json_keeps_the_stored_strings(hostile: None, env: dict[str, str]) -> None:
    tail = [
        json.loads(line)
        for line in lines_of((await asyncio.to_thread(run, env, "events", "tail", "--json")).stdout)
    ]
    assert [d["event"]["reason"] for d in tail if d["event_type"] == "failed"] == [HOSTILE]
    ghost = next(d["event"] for d in tail if d["run_id"] == "ghost")
    assert (ghost["project"], ghost["command"], ghost["dataset_revision"]) == (
        "ghost-\x1b[2J",
        ["torchrun", HOSTILE],
        HOSTILE,
    )
    status = json.loads((await asyncio.to_thread(run, env, "status", "victim", "--json")).stdout)
    assert status["last_failure"] == HOSTILE
    replay = json.loads((await asyncio.to_thread(run, env, "replay", "victim", "--json")).stdout)
    assert replay[2]["event"]["message"] == HOSTILE
