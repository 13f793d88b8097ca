"""What the global data position and the accumulation cost a training step, on one process.

    python scripts/bench_data.py [--size 1000000] [--global-batch 1024] [--world 8] [--steps 200]

Prints one JSON document: the sampler's time per step (this rank's micro-batch ids of one global batch, and
`reached`), against torch's `DistributedSampler` handing out as many ids, and its permutation, made once an
epoch; and a step of the elastic example's
model at a fixed global batch of 32 split into 1, 2, 4 and 8 micro-batches (the accumulation a world 8, 4, 2
and 1 times smaller needs), each the median of `--steps` steps.
"""

import argparse
import json
import statistics
import time
from collections.abc import Callable
from itertools import islice

import torch
from torch import nn
from torch.utils.data import DistributedSampler

from ftrain.train.sampler import GlobalSampler, sample_uniform


def median_seconds(step: Callable[[], object], steps: int) -> float:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def sampler_costs(size: int, global_batch: int, world: int, steps: int) -> dict[str, float]:
    sampler = GlobalSampler(size, global_batch, micro_batch=global_batch // world // 4, rank=1, world=world)
    micro_batches = sampler.micro_batches()
    done = [0]

    def ours() -> None:
        for ids in islice(micro_batches, sampler.accumulation):
            ids.tolist()
        done[0] += 1
        sampler.reached(done[0])

    theirs_iter = iter(DistributedSampler(range(size), num_replicas=world, rank=1, shuffle=True))

    def theirs() -> None:
        list(islice(theirs_iter, global_batch // world))

    ours()  # the first epoch's permutation, made once an epoch by each
    theirs()
    epochs = iter(range(1, 10**9))
    return {
        "permutation_ms_per_epoch": median_seconds(lambda: sampler.order(next(epochs)), 5) * 1e3,
        "global_sampler_us_per_step": median_seconds(ours, steps) * 1e6,
        "distributed_sampler_us_per_step": median_seconds(theirs, steps) * 1e6,
    }


def accumulation_costs(steps: int) -> dict[str, float]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, ids = torch.randn(32, 16), torch.arange(32)
    y = x.sum(dim=1, keepdim=True).sin()
    costs = {}
    for parts in (1, 2, 4, 8):

        def step(parts: int = parts) -> None:
            for xs, ys, ii in zip(x.chunk(parts), y.chunk(parts), ids.chunk(parts), strict=True):
                keep = sample_uniform(0, 1, ii, (64,)) >= 0.2
                hidden = model[1](model[0](xs)) * keep / 0.8
                (nn.functional.mse_loss(model[2](hidden), ys) / parts).backward()
            optimizer.step()
            optimizer.zero_grad()

        costs[f"step_ms_{parts}_micro_batches"] = median_seconds(step, steps) * 1e3

    def mask_only() -> None:
        sample_uniform(0, 1, ids, (64,))

    costs["per_sample_masks_ms_32_samples"] = median_seconds(mask_only, steps) * 1e3
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--global-batch", type=int, default=1024)
    parser.add_argument("--world", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    result = {
        **vars(args),
        **sampler_costs(args.size, args.global_batch, args.world, args.steps),
        **accumulation_costs(args.steps),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
