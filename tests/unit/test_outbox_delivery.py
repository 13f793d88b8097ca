"""Delivering a run's pending intents to its log (`workers.recorder.deliver`, over the in-process log): each
lands once, a refused one is set aside with its reason, and losing every race keeps them pending. The recorder
against a real server that is killed and restarted, and real processes: tests/integration/test_outbox.py."""

import pytest

from ftrain import settings
from ftrain.domain import command_handler
from ftrain.domain.command_handler import ContendedRun, RunLog
from ftrain.domain.lifecycle import FailIntent, ResumeIntent, decide_intent
from ftrain.events.chain import unseal
from ftrain.events.schema import AnyEvent, decode_event
from ftrain.service import RunService
from ftrain.workers.outbox import Outbox, outbox_path
from ftrain.workers.recorder import deliver
from tests.support.builders import launched
from tests.unit.test_outbox_deciding import RUN, ckpt


async def launch(app: RunService, run_id: str = RUN) -> None:
    await app.launch(launched, lambda: [run_id])


async def run_events(app: RunService, run_id: str = RUN) -> list[AnyEvent]:
    """The run's events as stored, oldest first."""
    out = []
    async for records in app.store.read(1, run_id=run_id):
        for record in records:
            parts = unseal(record.payload)
            assert parts is not None
            out.append(decode_event(parts[0]))
    return out


def node_outbox(env: dict[str, str]) -> Outbox:
    """The outbox the recorder of a process with `env` writes to."""
    return Outbox(outbox_path(settings.home(env)))


def kinds(events: list[AnyEvent]) -> list[str]:
    return [type(e).__name__ for e in events]


async def test_an_intent_appended_but_not_marked_done_is_not_appended_again(
    app: RunService, env: dict[str, str]
) -> None:
    """A crash between the append and `done`: the event is in the log, the row still pending."""
    await launch(app)
    outbox = node_outbox(env)
    await app.fail(RUN, reason="preempted", exit_code=None)
    outbox.put(RUN, ResumeIntent(checkpoint_hash=None, step=0))
    (row,) = outbox.pending(RUN)
    await RunLog(app.store, RUN).append(
        lambda state: state and decide_intent(state, row.intent, row.intent_id, row.created_at)
    )
    await app.fail(
        RUN, reason="node-failure", exit_code=None
    )  # another writer: re-deciding would resume again
    before = await run_events(app)
    assert await deliver(RunLog(app.store, RUN), outbox) == 0
    assert await run_events(app) == before
    assert outbox.pending(RUN) == []
    assert (await app.state_of(RUN)).resume_count == 1


async def test_a_resume_the_fold_refuses_is_set_aside_with_its_reason_and_the_rest_still_lands(
    app: RunService, env: dict[str, str]
) -> None:
    await launch(app)
    outbox = node_outbox(env)
    outbox.put(RUN, ckpt(100))
    outbox.put(RUN, ckpt(200))
    outbox.put(RUN, FailIntent(reason="preempted"))
    outbox.put(
        RUN, ResumeIntent(checkpoint_hash=ckpt(100).checkpointed.checkpoint_hash, step=100)
    )  # not the newest
    outbox.put(RUN, ResumeIntent(checkpoint_hash=ckpt(200).checkpointed.checkpoint_hash, step=200))
    assert await deliver(RunLog(app.store, RUN), outbox) == 4
    (rejected,) = outbox.rejected(RUN)
    assert rejected.intent == ResumeIntent(checkpoint_hash=ckpt(100).checkpointed.checkpoint_hash, step=100)
    assert "newest valid checkpoint" in rejected.reason
    assert kinds(await run_events(app)) == ["Launched", "Checkpointed", "Checkpointed", "Failed", "Resumed"]
    assert outbox.pending(RUN) == []


async def test_a_run_other_writers_keep_appending_to_keeps_its_intents_pending_never_refused(
    app: RunService, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Losing every race to other writers is transient: the intents stay pending, in order, for the next try
    (setting them aside would lose their events), and land once the run is quiet."""
    await launch(app)
    outbox = node_outbox(env)
    ids = [outbox.put(RUN, ckpt(100)), outbox.put(RUN, ckpt(200))]
    monkeypatch.setattr(command_handler, "CONFLICT_RETRIES", 0)  # as if another writer won every race
    with pytest.raises(ContendedRun):
        await deliver(RunLog(app.store, RUN), outbox)
    assert [row.intent_id for row in outbox.pending(RUN)] == ids and outbox.rejected(RUN) == []
    monkeypatch.undo()
    assert await deliver(RunLog(app.store, RUN), outbox) == 2
    assert [e.id for e in (await run_events(app))[1:]] == ids
