"""`ftrain events tail`: every stored event, oldest first, each with its chain and signature verdicts; with
`--follow`, new events as they land, until SIGINT or SIGTERM. Its parser: `events_cmd`.

Following polls the store's batched direct-get read from the last sequence shown: the same fast read every
query uses, with nothing on the server (no consumer) to create or clean up.
"""

import argparse
import asyncio
import signal
from contextlib import aclosing, suppress
from typing import Any

from ftrain.cli import render
from ftrain.domain.chain_walk import ChainWalk
from ftrain.errors import NotFound
from ftrain.events.log_port import EventLog
from ftrain.projections.event_verdict import EventVerdict, event_verdict
from ftrain.service import RunService

POLL_S = 0.25


async def run_tail(app: RunService, args: argparse.Namespace, _: None) -> int:
    """Print the backlog, then (`--follow`) poll for more until a stop signal; exit 0 either way."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    stops = (signal.SIGINT, signal.SIGTERM)
    for signum in stops:
        loop.add_signal_handler(signum, stop.set)
    try:
        shown = await _tail(app.store, args, stop)
    finally:
        for signum in stops:
            loop.remove_signal_handler(signum)
    if not shown and args.run_id is not None and not args.follow:
        raise NotFound(f"unknown run {args.run_id!r}")
    return 0


async def _tail(store: EventLog, args: argparse.Namespace, stop: asyncio.Event) -> int:
    """Print records from stream seq 1 until caught up (and, following, until `stop`); how many were shown."""
    walk, next_seq, shown = ChainWalk(), 1, 0
    while not stop.is_set():
        async with aclosing(store.read(next_seq, run_id=args.run_id)) as batches:
            async for records in batches:
                for record in records:
                    verdict = event_verdict(walk, record, store.trust)
                    if args.json:
                        render.emit_json(_document(verdict))
                    else:
                        render.emit(_line(verdict))
                    next_seq, shown = record.stream_seq + 1, shown + 1
                if stop.is_set():
                    return shown
        if not args.follow:
            break
        with suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), POLL_S)
    return shown


def _line(v: EventVerdict) -> str:
    """One event in text: where it sits, what it says, and both verdicts."""
    chain = "ok" if v.ok else f"REJECTED: {v.chain}"
    verdict = f"[{chain}; {v.signature.verdict}]"
    if v.event is None:
        return f"#{v.stream_seq:<6} {'?':20}  {v.run_id}  {'?':8} {v.event_type:<16} {verdict}"
    e = v.event
    return (
        f"#{v.stream_seq:<6} {render.timestamp(e.time)}  {v.run_id}  seq {e.seq:<4} {v.event_type:<16} "
        f"{render.summary(e)}  {verdict}"
    )


def _document(v: EventVerdict) -> dict[str, Any]:
    """One event in `--json`: the decoded event (null when undecodable) and both verdicts."""
    return {
        "stream_seq": v.stream_seq,
        "run_id": v.run_id,
        "event_type": v.event_type,
        "event": v.event,
        "hash": v.hash,
        "signer": v.signature.signer,
        "signer_name": v.signature.name,
        "chain": v.chain,
        "signature": v.signature.verdict,
    }
