"""The SQLite read model folded from the log, over the in-process one: incremental catch-up that sees another
client's appends, rebuild equality, exactly-once under concurrent projectors, stale batches refused, a model
bound to another stream reset (projectors in threads and processes of their own while the stream grows:
tests/integration/test_projection.py)."""

import asyncio
import sqlite3
from contextlib import closing
from pathlib import Path

import msgspec
import pytest

from ftrain.events.chain import ChainHead
from ftrain.events.schema import Failed
from ftrain.projections.projector import Projector
from ftrain.projections.readmodel import DEFERRED_INDEX, Batch, Position, ReadModel
from ftrain.service import RunService
from ftrain.workers.storage.location import uri_path
from tests.support.builders import checkpointed, launched, written_checkpoint
from tests.support.in_process import OpenService, in_process_service


async def scenario(app: RunService, runs: int = 3, checkpoints: int = 20, real: int | None = None) -> int:
    """Runs with checkpoints and a preemption each; returns the number of events. No files are behind the
    checkpoints but the one at step `real` of each run, written to the app's storage."""
    storage = uri_path(app.storage)
    for r in range(runs):
        # the run's directory is listable, so its missing checkpoints are corrupt, not storage unavailable
        (storage / f"run{r}").mkdir(parents=True, exist_ok=True)
        made = msgspec.structs.replace(launched(f"run{r}", project=f"proj{r % 2}"), storage=storage.as_uri())
        head = (await app.store.append(made, ChainHead())).head
        for step in range(10, checkpoints * 10 + 1, 10):
            run = f"run{r}"
            event = written_checkpoint(storage, run, step) if step == real else checkpointed(run, step)
            head = (await app.store.append(event, head)).head
        await app.store.append(Failed(run_id=f"run{r}", reason="preempted"), head)
    return runs * (checkpoints + 2)


async def test_catch_up_is_incremental_and_read_your_writes(
    app: RunService, env: dict[str, str], another: OpenService
) -> None:
    total = await scenario(app, real=150)
    assert await app.projector.catch_up() == total
    assert await app.projector.catch_up() == 0
    state = await app.state_of("run1")
    assert (state.status, state.step, len(state.checkpoints), state.failures) == ("failed", 200, 20, 1)
    async with another() as other:  # another client appends; this one's next query sees it
        await other.resume("run2")
    state = await app.state_of("run2")  # the five newer checkpoints were missing: resumed from the real one
    assert (state.status, state.step, state.resume_count) == ("running", 150, 1)
    assert [c.step for c in state.checkpoints if c.status == "corrupt"] == [160, 170, 180, 190, 200]
    assert [s.run_id for s in await app.states("proj0")] == ["run0", "run2"]
    dump = await app.model.dump()
    assert len(dump["audit"]) == total + 5 + 1 and {row[8] for row in dump["audit"]} == {"ok"}
    assert len(dump["checkpoints"]) == 60
    assert sum(1 for row in dump["checkpoints"] if row[8] == "corrupt") == 5


async def test_rebuild_from_sequence_one_equals_the_incremental_model(
    app: RunService, tmp_path: Path
) -> None:
    await scenario(app, runs=2, checkpoints=5)
    await app.projector.catch_up()
    await app.resume("run0")  # the files are missing: five corrupt_skipped events
    await app.store.append(checkpointed("run1", 999), ChainHead(7, "f" * 64, 14))  # a forged, broken link
    await app.projector.catch_up()
    incremental = await app.model.dump()
    assert len(incremental["broken_runs"]) == 1
    async with await ReadModel.open(tmp_path / "fresh.sqlite") as fresh:
        assert await Projector(app.store, fresh, app.projector.stream_id).catch_up() == len(
            incremental["audit"]
        )
        assert await fresh.dump() == incremental
    assert await app.projector.rebuild() == len(incremental["audit"])
    assert await app.model.dump() == incremental


POLLS = 100_000


def indexes(path: Path) -> set[str]:
    with closing(sqlite3.connect(path)) as db:
        return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}


async def test_a_replay_stopped_midway_leaves_rows_matching_its_position_and_resumes(
    app: RunService, tmp_path: Path
) -> None:
    total = await scenario(app, runs=4, checkpoints=250)
    path = tmp_path / "stopped.sqlite"
    async with await ReadModel.open(path) as model, await ReadModel.open(path) as reader:
        replay = asyncio.ensure_future(
            Projector(app.store, model, app.projector.stream_id, batch=10).catch_up()
        )
        for _ in range(POLLS):  # until its first batch is committed
            if await reader.last_seq():
                break
            await asyncio.sleep(0)
        replay.cancel()  # as a Ctrl-C would, between or during the commits of its batches
        with pytest.raises(asyncio.CancelledError):
            await replay
        at = await reader.last_seq()
        assert 0 < at < total
        dump = await reader.dump()  # every row up to the position, none past it
        assert [row[0] for row in dump["audit"]] == list(range(1, at + 1))
        last_of_run: dict[str, int] = {}
        for row in dump["audit"]:
            last_of_run[row[1]] = row[0]
        assert {s.run_id: s.head.stream_seq for s in await reader.runs()} == last_of_run
        assert DEFERRED_INDEX not in indexes(path)  # built once caught up
        assert await Projector(app.store, reader, app.projector.stream_id).catch_up() == total - at
        await app.projector.catch_up()
        assert await reader.dump() == await app.model.dump()
        assert DEFERRED_INDEX in indexes(path)


async def test_concurrent_projectors_apply_each_event_exactly_once(app: RunService, tmp_path: Path) -> None:
    total = await scenario(app, runs=4, checkpoints=50)
    path = tmp_path / "shared.sqlite"
    models = [await ReadModel.open(path) for _ in range(3)]
    try:
        projectors = [Projector(app.store, m, app.projector.stream_id) for m in models]
        applied = await asyncio.gather(*(p.catch_up() for p in projectors))
        assert sum(applied) == total  # every event applied once, whichever process applied it
        assert await models[0].last_seq() == total
        dump = await models[1].dump()
        assert [row[0] for row in dump["audit"]] == list(range(1, total + 1))
    finally:
        for m in models:
            await m.close()


async def test_a_stale_batch_is_refused_whole(app: RunService) -> None:
    await scenario(app, runs=1, checkpoints=3)
    await app.projector.catch_up()
    before = await app.model.dump()
    at = await app.model.position()
    assert at == Position(app.projector.stream_id, 1, 5)
    # last_seq 0, the generation before the model was bound, another stream: each is not where the model is
    for stale in ({"last_seq": 0}, {"generation": 0}, {"stream_id": "another stream"}):
        assert await app.model.commit(msgspec.structs.replace(at, **stale), 99, Batch()) is False
    assert await app.model.dump() == before
    assert await app.model.last_seq() == 5


async def test_a_model_bound_to_another_stream_is_reset(app: RunService, env: dict[str, str]) -> None:
    await scenario(app, runs=1, checkpoints=2)
    await app.projector.catch_up()
    elsewhere = {**env, "FTRAIN_NATS_URL": "nats://127.0.0.1:4999"}  # another log: its anchors, its model
    async with in_process_service(elsewhere) as app2:  # never connects: its stream is in this process
        await app2.store.append(launched("elsewhere"), ChainHead())
        # the same read-model file, another stream: none of the old rows may leak into its views
        projector = Projector(app2.store, app.model, app2.projector.stream_id)
        assert await projector.catch_up() == 1
        assert [s.run_id for s in await app.model.runs()] == ["elsewhere"]
