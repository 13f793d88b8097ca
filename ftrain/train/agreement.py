"""Every rank of a group learning that one of them refused, and why, before any waits for the others.

A rank that raises alone leaves its peers waiting in the next collective until torchrun kills them, and the
refusal is said only on rank 0 (`process_exit.say_once`): when another rank was the one to refuse, or rank 0
was still connecting a process group as its peer left (gloo's `connectFullMesh failed`), nobody said why.
Deciding together (one small all-reduce when nobody refused) lets every rank raise at the same point.
`any_rank` is the same agreement on a plain flag; `rank_zeros` is the other half: what rank 0 alone decided
(a plan, an outcome, a header), on every rank.
"""

from typing import TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


def lowest_refusal(mine: str | None, group: dist.ProcessGroup) -> tuple[int, str] | None:
    """Every rank of `group`, each with its own refusal (`mine`, None: none): the lowest refusing rank and
    its words, the same on every rank; None when no rank refused."""
    refused = torch.tensor([mine is not None], dtype=torch.uint8)
    dist.all_reduce(refused, op=dist.ReduceOp.MAX, group=group)
    if not refused.item():
        return None
    every: list[str | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, mine, group=group)
    return next((rank, words) for rank, words in enumerate(every) if words is not None)


def any_rank(mine: bool, group: dist.ProcessGroup) -> bool:
    """Whether `mine` holds on any rank of `group` (one small all-reduce), the same answer on every rank."""
    flag = torch.tensor([mine], dtype=torch.uint8)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return bool(flag.item())


def rank_zeros(value: T | None, group: dist.ProcessGroup) -> T:
    """Rank 0's `value` on every rank of `group` (the others pass None)."""
    box: list[T | None] = [value]
    dist.broadcast_object_list(box, src=0, group=group)
    assert box[0] is not None
    return box[0]
