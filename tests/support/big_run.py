"""A long run's log built in a second: `events` signed, correctly chained, legal events of one run published
pipelined with a plain client (what `ftrain run` would append over weeks: checkpoints with their figures, and
every `failure_every` events a failure, by turns preempted, a hang and a lease takeover, and the resume from
the newest checkpoint; then its completion). Each event is checked by the chain walk's own fold before it is published."""

import asyncio
import os
from datetime import timedelta
from pathlib import Path

import msgspec

from ftrain.domain.chain_walk import Folded, fold_record
from ftrain.domain.lifecycle import RunState, completed_event
from ftrain.events.chain import seal
from ftrain.events.keyring import load_signer
from ftrain.events.record import StoredRecord, run_subject
from ftrain.events.schema import AnyEvent, Checkpointed, Failed, Resumed, encode_event, event_type
from ftrain.events.signed_log import process_actor
from tests.support.builders import SIGNER, T0, launched
from tests.support.servers import plain_connect

REASONS = ("preempted", "hang", "lost")


def long_run(home: Path, run_id: str, events: int, failure_every: int = 500) -> list[tuple[str, bytes]]:
    """The (subject, payload) of each event, in order, signed by this user's key under `home`."""
    sign = load_signer(home, SIGNER).sign_hash
    actor, state, out = process_actor(), None, []
    step, failures, opened, lost = 0, 0, 0, 0

    def add(event: AnyEvent) -> RunState:
        head = state.head if state is not None else None
        stamped = msgspec.structs.replace(
            event, seq=len(out) + 1, prev_hash=head.hash if head else "0" * 64, id=os.urandom(16).hex(),
            time=T0 + timedelta(seconds=10 * len(out)), actor=actor,
        )  # fmt: skip
        payload, _ = seal(encode_event(stamped), stamped.prev_hash, sign)
        folded = fold_record(state, StoredRecord(len(out) + 1, run_id, event_type(event), payload))
        assert isinstance(folded, Folded), folded
        out.append((run_subject(run_id, event_type(event)), payload))
        return folded.state

    state = add(launched(run_id, project="long"))
    while len(out) < events - 1:
        if len(out) % failure_every == failure_every - 2 and state.checkpoints and len(out) < events - 3:
            reason = REASONS[failures % len(REASONS)]
            failures += 1
            state = add(Failed(run_id=run_id, reason=reason, exit_code=137, attempt=state.attempt))
            ref = state.checkpoints[-1]
            state = add(Resumed(run_id=run_id, checkpoint_seq=ref.seq, step=ref.step, epoch=ref.epoch, uri=ref.uri,
                                checkpoint_hash=ref.checkpoint_hash, resume_count=state.resume_count + 1,
                                attempt=state.attempt + 1))  # fmt: skip
            step, opened, lost = ref.step, len(out), 7
            continue
        step += 10
        loop = 10.0 * (len(out) - opened) + 5
        state = add(Checkpointed(run_id=run_id, step=step, epoch=step // 1000, shards=1,
                                 uri=f"file:///tmp/absent/{run_id}/step-{step}", checkpoint_hash=f"{step:064x}",
                                 size_bytes=1 << 20, attempt=state.attempt, stall_seconds=0.05 + (step % 70) / 1000,
                                 train_seconds=0.9 * loop, loop_seconds=loop, lost_steps=lost))  # fmt: skip
    add(completed_event(state, None, state.updated_at))
    return out


async def publish(url: str, nkey: str, messages: list[tuple[str, bytes]]) -> None:
    """Publish them in order, pipelined, and wait for every acknowledgement."""
    nc = await plain_connect(url, nkey)
    try:
        js = nc.jetstream(publish_async_max_pending=2000)
        acks = [await js.publish_async(subject, payload) for subject, payload in messages]
        await asyncio.gather(*acks)
    finally:
        await nc.close()
