"""A deterministic synthetic dataset and a resumable, sharded, shuffling batch iterator.

The loader's position (epoch, batch index) is part of the checkpoint: after a resume the same batches come
in the same order, which bit-identical resume needs.
"""

from typing import Any

import torch


def synthetic_tokens(count: int, length: int, vocab: int, seed: int) -> torch.Tensor:
    """`count` sequences of arithmetic progressions mod `vocab` (learnable, so the loss falls)."""
    gen = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (count, 1), generator=gen)
    stride = torch.randint(1, 8, (count, 1), generator=gen)
    return (start + stride * torch.arange(length)) % vocab


class ResumableLoader:
    """Each rank's batches: a per-epoch permutation (seeded), split across ranks, walked in order."""

    def __init__(self, data: torch.Tensor, batch: int, rank: int, world: int, seed: int) -> None:
        self.data, self.batch, self.rank, self.world, self.seed = data, batch, rank, world, seed
        self.epoch = 0
        self.index = 0
        self._order: tuple[int, torch.Tensor] | None = None

    @property
    def batches_per_epoch(self) -> int:
        """Full batches each rank gets per epoch."""
        return len(self.data) // self.world // self.batch

    def _indices(self) -> torch.Tensor:
        if self._order is None or self._order[0] != self.epoch:
            perm = torch.randperm(
                len(self.data), generator=torch.Generator().manual_seed(self.seed + self.epoch)
            )
            self._order = (self.epoch, perm[self.rank :: self.world])
        return self._order[1]

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next (inputs, targets) batch, rolling into the next epoch when this one is used up."""
        if self.index >= self.batches_per_epoch:
            self.epoch, self.index = self.epoch + 1, 0
        rows = self._indices()[self.index * self.batch : (self.index + 1) * self.batch]
        self.index += 1
        seqs = self.data[rows]
        return seqs[:, :-1], seqs[:, 1:]

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epoch, self.index = int(state_dict["epoch"]), int(state_dict["index"])
