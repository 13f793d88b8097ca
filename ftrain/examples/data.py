"""A deterministic synthetic dataset and a resumable, distributed, shuffling batch iterator.

The loader's position is a global one (epoch, samples consumed, seed) and part of the checkpoint: after a
resume, on any world size, the same global batches come in the same order, which exact resume needs.
"""

from collections.abc import Iterator
from typing import Any

import torch

from ftrain.events.schema import DataPosition
from ftrain.train.sampler import GlobalSampler


def synthetic_tokens(count: int, length: int, vocab: int, seed: int) -> torch.Tensor:
    """`count` sequences of arithmetic progressions mod `vocab` (learnable, so the loss falls)."""
    gen = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (count, 1), generator=gen)
    stride = torch.randint(1, 8, (count, 1), generator=gen)
    return (start + stride * torch.arange(length)) % vocab


class ResumableLoader:
    """ftrain's own loader over a tensor of sequences: this rank's micro-batches of every global batch, from a
    global data position (`GlobalSampler`), so a resume on any world size goes on with the next global batch."""

    def __init__(
        self,
        data: torch.Tensor,
        batch: int,
        rank: int,
        world: int,
        seed: int,
        global_batch: int | None = None,
    ) -> None:
        """`batch`: samples per micro-batch on one rank; `global_batch`: per optimizer step, over every rank
        (default: `batch` × `world`, no accumulation)."""
        self.data = data
        self.sampler = GlobalSampler(
            len(data), global_batch or batch * world, micro_batch=batch, seed=seed, rank=rank, world=world
        )
        self._batches: Iterator[torch.Tensor] | None = None

    @property
    def epoch(self) -> int:
        """The epoch of the data position."""
        return self.sampler.position().epoch

    @property
    def accumulation(self) -> int:
        """Micro-batches per optimizer step on this world."""
        return self.sampler.accumulation

    def next(self) -> tuple[torch.Tensor, torch.Tensor, float]:
        """The next micro-batch's (inputs, targets) and its loss scale (`GlobalSampler.loss_scale`)."""
        if self._batches is None:  # from the position `load` restored
            self._batches = self.sampler.micro_batches()
        rows = next(self._batches)
        seqs = self.data[rows]
        return seqs[:, :-1], seqs[:, 1:], self.sampler.loss_scale(len(rows))

    def reached(self, step: int) -> None:
        self.sampler.reached(step)

    def position(self) -> DataPosition:
        return self.sampler.position()

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state_dict)
        self._batches = None
