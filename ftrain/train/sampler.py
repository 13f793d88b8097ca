"""A global data position: a seeded, resumable, distributed sampler whose state is where the run stands in the
global sample stream (epoch, global samples consumed, seed), never a per-rank index, so that a resume on any
world size gives every rank its slice of the same next global batch.

Each epoch is one permutation of the dataset, seeded by (seed, epoch); every optimizer step trains on the next
`global_batch` ids of it (an epoch's tail shorter than a global batch is left out); rank r of a world of w takes
the r-th of w slices (sizes differ by one at most) and walks it in micro-batches, the same number on every rank
(gradient accumulation): a smaller world accumulates over more micro-batches, a larger one over fewer. Scaling
each micro-batch's mean loss by `loss_scale` makes the gradient the global batch's mean on any world.
The position moves with the optimizer steps the loop finished (`reached`, which the checkpoint manager's
`due` calls), not with the ids a loader's workers have prefetched, so the saved position is what was trained.
"""

import hashlib
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

import torch
import torch.distributed as dist

from ftrain.events.schema import DataPosition


@runtime_checkable
class GlobalPosition(Protocol):
    """A data source whose saved state is a global position, valid on any world size: what the checkpoint
    manager asks of a loader before it resumes it on another world."""

    def reached(self, step: int) -> None: ...

    def position(self) -> DataPosition: ...


def accumulation(global_batch: int, micro_batch: int, world: int) -> int:
    """Micro-batches (of at most `micro_batch` samples) each rank trains per optimizer step so that `world`
    ranks together train `global_batch` samples; ValueError naming the numbers when that cannot be."""
    if micro_batch < 1 or not world <= global_batch:
        raise ValueError(
            f"global_batch={global_batch}, micro_batch={micro_batch}: a micro-batch of at least 1 sample "
            f"and a global batch of at least one sample per rank ({world} ranks)"
        )
    largest_slice = -(-global_batch // world)
    count = -(-largest_slice // micro_batch)
    if global_batch // world < count:
        raise ValueError(
            f"global_batch={global_batch} on {world} ranks in micro-batches of {micro_batch}: a rank would get "
            "an empty micro-batch; choose a larger micro_batch or a global batch divisible by the world"
        )
    return count


def sample_generator(seed: int, step: int, index: int) -> torch.Generator:
    """A generator of its own for one sample at one step: random draws keyed by (seed, step, global sample
    index) are the same whichever rank, world size or micro-batch trains the sample."""
    key = hashlib.blake2b(f"{seed}:{step}:{index}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(key, "little") & (2**63 - 1))


def sample_uniform(seed: int, step: int, ids: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Uniform draws of `shape` for each sample of `ids` (stacked), each from its own `sample_generator`: a
    dropout mask or an augmentation that does not depend on the rank, the world or the micro-batch."""
    return torch.stack([torch.rand(shape, generator=sample_generator(seed, step, int(i))) for i in ids])


class GlobalSampler(torch.utils.data.Sampler[list[int]]):
    """This rank's micro-batches of every global batch, from the saved position on, without end (epochs roll
    over).

    Use it as a `DataLoader`'s (or torchdata `StatefulDataLoader`'s) `batch_sampler`, or iterate
    `micro_batches()` yourself, and hand it (or the loader over it) to the checkpoint manager as `loader=`:
    its position is saved with each checkpoint and restored on any world size."""

    def __init__(
        self,
        size: int,
        global_batch: int,
        *,
        micro_batch: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        rank: int | None = None,
        world: int | None = None,
    ) -> None:
        """`size`: the dataset's samples; `global_batch`: samples per optimizer step, over all ranks;
        `micro_batch`: samples per forward pass on one rank (default: the whole slice, no accumulation);
        rank and world default to the process group's. ValueError naming a bad number."""
        self.rank = dist.get_rank() if rank is None and dist.is_initialized() else (rank or 0)
        self.world = dist.get_world_size() if world is None and dist.is_initialized() else (world or 1)
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank={self.rank}: not in a world of {self.world}")
        if size < global_batch:
            raise ValueError(f"size={size}: smaller than one global batch of {global_batch}")
        self.micro_batch = micro_batch or -(-global_batch // self.world)
        self.accumulation = accumulation(global_batch, self.micro_batch, self.world)
        """Micro-batches per optimizer step on every rank of this world."""
        self.size, self.global_batch, self.seed, self.shuffle = size, global_batch, seed, shuffle
        self._epoch = self._offset = self._consumed = self._step = 0
        self._order: tuple[int, torch.Tensor] | None = None

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps in one epoch (its tail shorter than a global batch left out)."""
        return self.size // self.global_batch

    def position(self) -> DataPosition:
        """The position after the last step the loop reached."""
        return DataPosition(self._epoch, self._offset, self._consumed, self.seed)

    def reached(self, step: int) -> None:
        """Optimizer step `step` is finished: the position moves past every global batch up to it."""
        if step < self._step:
            raise ValueError(f"step {step} is behind the data position's step {self._step}")
        for _ in range(step - self._step):
            self._offset += self.global_batch
            self._consumed += self.global_batch
            if self._offset + self.global_batch > self.size:
                self._epoch, self._offset = self._epoch + 1, 0
        self._step = step

    def order(self, epoch: int) -> torch.Tensor:
        """Epoch `epoch`'s sample ids, in the order the run trains them (the same on every rank)."""
        if self._order is None or self._order[0] != epoch:
            ids = (
                torch.randperm(
                    self.size, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
                )
                if self.shuffle
                else torch.arange(self.size)
            )
            self._order = (epoch, ids)
        return self._order[1]

    def global_batches(self) -> Iterator[torch.Tensor]:
        """Every global batch's ids from the current position on, in training order."""
        epoch, offset = self._epoch, self._offset
        while True:
            yield self.order(epoch)[offset : offset + self.global_batch]
            offset += self.global_batch
            if offset + self.global_batch > self.size:
                epoch, offset = epoch + 1, 0

    def micro_batches(self) -> Iterator[torch.Tensor]:
        """This rank's micro-batches of ids from the current position on: `accumulation` of them a step."""
        for batch in self.global_batches():
            yield from batch.tensor_split(self.world)[self.rank].tensor_split(self.accumulation)

    def loss_scale(self, samples: int) -> float:
        """What a micro-batch of `samples` multiplies its mean loss by, so that the gradients (averaged over
        the ranks, as DDP and FSDP do) are the global batch's mean, whatever the world and its slices."""
        return samples * self.world / self.global_batch

    def __iter__(self) -> Iterator[list[int]]:
        return (ids.tolist() for ids in self.micro_batches())

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self._epoch,
            "offset": self._offset,
            "consumed": self._consumed,
            "seed": self.seed,
            "size": self.size,
            "step": self._step,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a saved position; ValueError when it belongs to another dataset or permutation."""
        if int(state_dict["size"]) != self.size or int(state_dict["seed"]) != self.seed:
            raise ValueError(
                f"the saved data position is in a dataset of {state_dict['size']} samples with seed "
                f"{state_dict['seed']}; this sampler has {self.size} with seed {self.seed}"
            )
        self._epoch, self._offset = int(state_dict["epoch"]), int(state_dict["offset"])
        self._consumed, self._step = int(state_dict["consumed"]), int(state_dict["step"])
