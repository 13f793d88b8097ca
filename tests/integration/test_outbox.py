"""The durable local outbox and the recorder: the log must never stall or kill training.

Deciding is pure and tested without a server (tests/unit/test_outbox_deciding.py), and so is delivering to a
log, over the in-process one (tests/unit/test_outbox_delivery.py). This runs against a real nats-server that is
killed and restarted, real SQLite outbox files, and real processes: one that SIGKILLs itself with intents
pending, two that record into one outbox file at once.
"""

import asyncio
import getpass
import os
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
import structlog

from ftrain import settings
from ftrain.domain.command_handler import RunLog
from ftrain.domain.lifecycle import (
    CompleteIntent,
    FailIntent,
    Intent,
    ResumeIntent,
)
from ftrain.events.jetstream.nats_server import ServerProcess
from ftrain.events.schema import (
    Actor,
    Checkpointed,
    Launched,
)
from ftrain.service import RunService
from ftrain.workers.outbox import Outbox, outbox_path
from ftrain.workers.recorder import Recorder, deliver
from tests.support.processes import free_port
from tests.support.servers import kill_server, restart_server
from tests.unit.test_outbox_deciding import AT, RUN, ckpt
from tests.unit.test_outbox_delivery import kinds, launch, node_outbox, run_events

FLUSH_S = 30.0
UNREACHABLE_WARNING = "event_log_unreachable_intents_kept"


# -- the outbox file --------------------------------------------------------------------------------------------


def test_outbox_keeps_each_runs_rows_in_order_across_reopening_and_sets_refused_ones_aside(
    tmp_path: Path,
) -> None:
    path = tmp_path / "outbox.sqlite"
    first = Outbox(path)
    a1, _, a2 = first.put("a", ckpt(1)), first.put("b", ckpt(2)), first.put("a", FailIntent(reason="oom"))
    first.close()
    outbox = Outbox(path)
    pending = outbox.pending("a")
    assert [(row.intent_id, row.intent) for row in pending] == [(a1, ckpt(1)), (a2, FailIntent(reason="oom"))]
    outbox.reject(pending[0].row_id, "refused: because")
    outbox.done(outbox.pending("b")[0].row_id)
    assert [row.intent_id for row in outbox.pending("a")] == [a2]
    assert outbox.pending("b") == []
    assert [(r.intent_id, r.intent, r.reason) for r in outbox.rejected("a")] == [
        (a1, ckpt(1), "refused: because")
    ]
    assert outbox.rejected("b") == []


def test_a_row_this_version_cannot_read_is_set_aside_not_left_to_block_the_rest(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox.sqlite")
    db = sqlite3.connect(outbox.path, isolation_level=None)  # as a newer ftrain sharing the file would
    db.execute("INSERT INTO pending (run_id, intent_id, created_at, body) VALUES ('a', 'x', ?, ?)",
               (AT.isoformat(), b'{"type":"from-the-future"}'))  # fmt: skip
    db.close()
    later = outbox.put("a", ckpt(1))
    assert [row.intent_id for row in outbox.pending("a")] == [later]
    (rejected,) = outbox.rejected("a")
    assert (rejected.intent_id, rejected.intent) == ("x", None)
    assert rejected.reason.startswith("undecodable intent")


# -- against a real server -----------------------------------------------------------------------------------


async def until(condition: Callable[[], bool], limit_s: float = 20.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def knocked_on(port: int) -> None:
    """Stand in for the downed broker on its port until a client tries to connect, and hang up on it."""
    knocked = asyncio.Event()

    def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        knocked.set()
        writer.close()

    listener = await asyncio.start_server(hang_up, "127.0.0.1", port)
    async with listener:
        await knocked.wait()


@pytest.mark.own_server
async def test_with_the_broker_down_record_keeps_each_intent_and_they_land_in_order_once_it_is_back(
    env: dict[str, str], server: ServerProcess
) -> None:
    async with RunService.open(env) as app:
        await launch(app)
    kill_server(server)  # nothing else in this process is connected to it: only the recorder knocks
    sequence: list[Intent] = [
        ckpt(100),
        ckpt(200),
        FailIntent(reason="preempted"),
        ResumeIntent(checkpoint_hash=ckpt(200).checkpointed.checkpoint_hash, step=200),
        ckpt(300),
        CompleteIntent(),
    ]
    outbox = node_outbox(env)
    with structlog.testing.capture_logs() as logs, Recorder(RUN, settings.nats(env)) as recorder:
        ids = []
        for intent in sequence:  # each returns with its intent committed, the log being unreachable
            ids.append(recorder.record(intent))
            assert [row.intent_id for row in outbox.pending(RUN)] == ids
        assert not await asyncio.to_thread(recorder.flush, 0.5)
        await until(lambda: any(e["event"] == UNREACHABLE_WARNING for e in logs))
        await knocked_on(server.port)  # the first attempt gave up (the warning); this is a retry
        assert [row.intent_id for row in outbox.pending(RUN)] == ids  # retried, nothing appended or lost
        await asyncio.to_thread(restart_server, server)  # same port, same store
        assert await asyncio.to_thread(recorder.flush, FLUSH_S)
    outbox.close()
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
        UNREACHABLE_WARNING
    ]  # once an outage
    async with RunService.open(env) as app:
        events = await run_events(app)
        assert kinds(events) == ["Launched", "Checkpointed", "Checkpointed", "Failed", "Resumed", "Checkpointed",
                                 "Completed"]  # fmt: skip
        assert [e.id for e in events[1:]] == ids
        assert (await app.verify(RUN)).ok
        state = await app.state_of(RUN)
    assert (state.status, state.step, state.failures, state.resume_count) == ("completed", 300, 1, 1)
    assert [c.step for c in state.valid_checkpoints()] == [300, 200, 100]
    assert state.cost_source == "wall-time"


CHILD = """
import os, signal, sys
from ftrain import settings
from ftrain.workers.recorder import Recorder
from ftrain.domain.lifecycle import CheckpointIntent, FailIntent
from ftrain.events.schema import Checkpointed

run_id, first, count, then = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
recorder = Recorder(run_id, settings.nats(os.environ), rank=0)  # as a trainer's rank 0
for step in range(first, first + count):
    recorder.record(CheckpointIntent(checkpointed=Checkpointed(run_id=run_id, step=step, epoch=0, shards=1,
                                     uri=f"file:///nowhere/{step}", checkpoint_hash=f"{run_id}-{step}", size_bytes=1)))
if then == "die":
    recorder.record(FailIntent(reason="signal", exit_code=-9))
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(0 if recorder.close(20) else 3)
"""


def child(env: dict[str, str], run_id: str, first: int, count: int, then: str) -> subprocess.Popen[bytes]:
    """A process recording `count` checkpoints from step `first`, then dying (`die`) or flushing (`flush`)."""
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, run_id, str(first), str(count), then], env={**os.environ, **env}
    )


async def test_intents_of_a_killed_process_are_appended_in_order_by_the_next_recorder(
    app: RunService, env: dict[str, str]
) -> None:
    """As a trainer's rank 0 killed with the log out of reach, its events delivered by the supervisor: each
    event says who recorded it (the dead rank 0), when, and under which id, not who delivered it."""
    await launch(app)
    nowhere = {**env, "FTRAIN_NATS_URL": f"nats://127.0.0.1:{free_port()}"}  # so it dies with all pending
    dead = child(nowhere, RUN, 1, 3, "die")
    assert await asyncio.to_thread(dead.wait) == -9
    left = node_outbox(env).pending(RUN)
    assert [type(r.intent).__name__ for r in left] == [*["CheckpointIntent"] * 3, "FailIntent"]
    with Recorder(RUN, settings.nats(env)) as recorder:
        assert await asyncio.to_thread(recorder.flush, FLUSH_S)
    events = await run_events(app)
    assert kinds(events) == ["Launched", *["Checkpointed"] * 3, "Failed"]
    assert [e.id for e in events[1:]] == [r.intent_id for r in left]
    assert [e.time for e in events[1:]] == [r.created_at for r in left]  # when it happened, not when appended
    assert {(e.actor.pid, e.actor.rank) for e in events[1:] if e.actor} == {(dead.pid, 0)}
    assert all(e.actor for e in events)
    assert (await app.verify(RUN)).ok


async def test_an_outbox_file_of_an_older_ftrain_gains_the_actor_column_and_its_rows_land(
    app: RunService, env: dict[str, str]
) -> None:
    """A row written before the outbox kept its recorder: delivered, with the delivering process as actor."""
    await launch(app)
    path = outbox_path(settings.home(env))
    old = sqlite3.connect(path)
    old.executescript(OLD_SCHEMA)
    old.execute(
        "INSERT INTO pending (run_id, intent_id, created_at, body) VALUES (?, ?, ?, ?)",
        (RUN, "old-row", AT.isoformat(), msgspec.json.encode(ckpt(100))),
    )
    old.commit()
    old.close()
    outbox = node_outbox(env)  # opening it adds the column
    rank0 = Actor(user="someone", host="node9", pid=4242, rank=0)
    outbox.put(RUN, ckpt(200), rank0)
    with Recorder(RUN, settings.nats(env)) as supervisor:
        assert await asyncio.to_thread(supervisor.flush, FLUSH_S)
    events = await run_events(app)
    assert [(e.id, e.actor) for e in events[1:]] == [
        ("old-row", Actor(user=getpass.getuser(), host=socket.gethostname(), pid=os.getpid())),
        (events[2].id, rank0),
    ]
    outbox.put(
        RUN, FailIntent(reason="preempted", attempt=7), rank0
    )  # refused: `rejected` has the column too
    assert await deliver(RunLog(app.store, RUN), outbox) == 0
    assert [r.intent for r in outbox.rejected(RUN)] == [FailIntent(reason="preempted", attempt=7)]
    outbox.close()


OLD_SCHEMA = """
CREATE TABLE pending (
    row_id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, intent_id TEXT NOT NULL UNIQUE,
    created_at TEXT NOT NULL, body BLOB NOT NULL);
CREATE INDEX pending_by_run ON pending (run_id, row_id);
CREATE TABLE rejected (
    row_id INTEGER PRIMARY KEY, run_id TEXT NOT NULL, intent_id TEXT NOT NULL, created_at TEXT NOT NULL,
    body BLOB NOT NULL, reason TEXT NOT NULL, rejected_at TEXT NOT NULL);
"""


UNREAD = """
import os, sys, time
from ftrain import settings
from ftrain.logs import configure
from ftrain.domain.lifecycle import FailIntent
from ftrain.workers.recorder import Recorder

configure()  # logging as the trainer sets it up: warnings and errors to stderr
time.sleep(0.5)  # by now nobody reads our stderr: every write to it fails (EPIPE)
recorder = Recorder(sys.argv[1], settings.nats(os.environ))
recorder.record(FailIntent(reason="preempted", attempt=7))  # of an attempt the run never had
sys.exit(0 if recorder.close(20) else 3)
"""


def unread(env: dict[str, str]) -> int:
    """Run UNREAD with a stderr whose reader closed it at once; its exit status."""
    proc = subprocess.Popen(
        [sys.executable, "-c", UNREAD, RUN], env={**os.environ, **env}, stderr=subprocess.PIPE
    )
    assert proc.stderr is not None
    proc.stderr.close()
    return proc.wait()


async def test_a_recorder_whose_stderr_nobody_reads_still_sets_a_refused_intent_aside(
    app: RunService, env: dict[str, str]
) -> None:
    """As an old attempt's rank 0 whose launcher (or ssh connection) died: its log lines are dropped, never
    raised into the recorder, which must go on delivering."""
    await launch(app)
    assert await asyncio.to_thread(unread, env) == 0
    (refused,) = node_outbox(env).rejected(RUN)
    assert refused.intent == FailIntent(reason="preempted", attempt=7) and "attempt 7" in refused.reason
    assert kinds(await run_events(app)) == ["Launched"]


async def test_two_processes_recording_into_one_outbox_file_each_keep_their_order(
    app: RunService, env: dict[str, str]
) -> None:
    runs = {"run-a": 1, "run-b": 1001}
    for run_id in runs:
        await launch(app, run_id)
    children = [child(env, run_id, first, 10, "flush") for run_id, first in runs.items()]
    assert [await asyncio.to_thread(c.wait) for c in children] == [0, 0]
    for run_id, first in runs.items():
        events = await run_events(app, run_id)
        assert [e.step for e in events if isinstance(e, Checkpointed)] == list(range(first, first + 10))
        assert not [e for e in events if not isinstance(e, Launched | Checkpointed)]
        assert node_outbox(env).pending(run_id) == []
    assert (await app.verify()).ok


async def test_a_trainer_ranks_recorder_stamps_its_rank_and_the_supervisors_stamps_none(
    app: RunService, env: dict[str, str]
) -> None:
    await launch(app)
    with Recorder(RUN, settings.nats(env), rank=0) as trainer:
        trainer.record(ckpt(100))
        assert await asyncio.to_thread(trainer.flush, FLUSH_S)
    with Recorder(RUN, settings.nats(env)) as supervisor:
        supervisor.record(FailIntent(reason="preempted"))
        assert await asyncio.to_thread(supervisor.flush, FLUSH_S)
    events = await run_events(app)
    assert kinds(events) == ["Launched", "Checkpointed", "Failed"]
    assert [e.actor.rank if e.actor else "no actor" for e in events[1:]] == [0, None]
    assert events[1].actor is not None and events[1].actor.pid == os.getpid()
