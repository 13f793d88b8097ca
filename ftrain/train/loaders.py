"""What the checkpoint manager makes of the `loader=` a script hands it: the state to save, whether that state is
a global data position (valid on any world size) or per rank, and a generator of the loader's own.

A loader is saved as the first of these that applies: a loader over a sampler with a global position (ftrain's
`GlobalSampler` as the `batch_sampler` of a `DataLoader` or of torchdata's `StatefulDataLoader`) saves the sampler's position, the
steps trained, never the ids its workers prefetched; a loader with a state of its own (`StatefulDataLoader`,
one of the user's) saves that, per rank; a plain `DataLoader` over a resumable sampler saves the sampler. A
loader without a `generator` gets one, seeded from the global generator when the manager is made: creating
its iterator then draws its workers' base seed from it instead of from the global generator that `load()`
restores, so a resume does not shift the model's random draws (dropout) by one.
"""

import msgspec
import torch

from ftrain.train.sampler import GlobalPosition
from ftrain.train.state import Resumable, resumable


class DataSource(msgspec.Struct, frozen=True, kw_only=True):
    """The loader as the manager saves it: `saved` (None: nothing can be), `position` when that state is a
    global data position, and `name` for messages."""

    name: str
    saved: Resumable | None = None
    position: GlobalPosition | None = None


def adopt(loader: object) -> DataSource:
    """The loader's saved state, found as the module docstring says; gives it a generator of its own."""
    if getattr(loader, "generator", False) is None:
        seed = int(torch.empty((), dtype=torch.int64).random_().item())
        loader.generator = torch.Generator().manual_seed(seed)  # type: ignore[attr-defined]
    name = type(loader).__name__
    for candidate in (loader, *_samplers(loader)):
        if isinstance(candidate, GlobalPosition) and resumable(candidate):
            return DataSource(name=name, saved=candidate, position=candidate)  # type: ignore[arg-type]
    for candidate in (loader, *_samplers(loader)):
        if resumable(candidate):
            return DataSource(name=name, saved=candidate)  # type: ignore[arg-type]
    return DataSource(name=name)


def _samplers(loader: object) -> list[object]:
    """A data loader's samplers: its batch sampler, its `sampler`, and the batch sampler's."""
    batches = getattr(loader, "batch_sampler", None)
    found = [batches, getattr(loader, "sampler", None), getattr(batches, "sampler", None)]
    return [s for s in found if s is not None]
