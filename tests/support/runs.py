"""Runs made through the application service, as the CLI's commands make them, and the stream read back."""

import os
from collections.abc import Callable
from pathlib import Path

from ftrain.events.chain import unseal
from ftrain.events.schema import AnyEvent, Checkpointed, Launched, decode_event
from ftrain.service import RunService


def launch_maker(project: str = "P") -> Callable[[str], Launched]:
    def make(run_id: str) -> Launched:
        return Launched(
            run_id=run_id,
            project=project,
            strategy="fsdp",
            nodes=1,
            gpus_per_node=1,
            hosts=("localhost",),
            allocation_source="localhost",
            rdzv_endpoint="localhost:29500",
            command=("torchrun", "-m", "train"),
            storage=Path(os.environ["FTRAIN_STORAGE"]).as_uri(),  # where `checkpoint` writes
        )

    return make


async def launch(app: RunService, run_id: str) -> Launched:
    return await app.launch(launch_maker(), lambda: [run_id])


async def checkpoint(app: RunService, run_id: str, step: int, state: bytes = b'{"a":1}') -> Checkpointed:
    return await app.checkpoint(
        run_id, step=step, epoch=step // 100, shards=1, sources=[("state.json", state)]
    )


async def stored(app: RunService, run_id: str | None = None) -> list[tuple[int, AnyEvent, str]]:
    """(stream seq, decoded event, stored hash) of every record of the stream, or of one run."""
    out = []
    async for records in app.store.read(1, run_id=run_id):
        for record in records:
            parts = unseal(record.payload)
            assert parts is not None
            out.append((record.stream_seq, decode_event(parts[0]), parts[1]))
    return out
