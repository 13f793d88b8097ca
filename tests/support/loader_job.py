"""A training script with dropout (the global generator) over the loaders people use, for the exact-resume tests.

    python -m tests.support.loader_job --loader stateful --location DIR|s3://B/P --losses FILE [--reference DIR FILE]

`--loader`: `stateful` (torchdata's StatefulDataLoader, 2 workers, over a shuffling DistributedSampler),
`stateful-shuffle` (the same with `shuffle=True`), `global` (a plain DataLoader, 2 workers, over ftrain's
GlobalSampler with accumulation), `own` (ftrain's example loader). Every step's loss goes to `--losses`, one
JSON line; `--reference` then trains the same from scratch at another location, as one uninterrupted run;
`--async-save` saves through the async pipeline; `--world-change` is the manager's `world_change`.
Under torchrun each rank trains its share (gloo).
"""

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from ftrain.examples.data import ResumableLoader
from ftrain.train.checkpointing import CheckpointManager, ResumeRefused
from ftrain.train.process_exit import run_then_exit
from ftrain.train.sampler import GlobalSampler

SAMPLES, BATCH = 96, 8


def make_loader(kind: str, data: torch.Tensor, targets: torch.Tensor) -> Any:
    dataset = TensorDataset(data, targets)
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    if kind == "stateful":
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=3)
        return StatefulDataLoader(dataset, batch_size=BATCH, sampler=sampler, num_workers=2)
    if kind == "stateful-shuffle":
        return StatefulDataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=2)
    if kind == "global":
        sampler = GlobalSampler(SAMPLES, 2 * BATCH * world, micro_batch=BATCH, seed=3)
        return DataLoader(dataset, batch_sampler=sampler, num_workers=2)
    return ResumableLoader(torch.cat([data, targets], dim=1), BATCH, rank, world, 3, global_batch=2 * BATCH)


def batches(loader: Any, epoch: int) -> Any:
    """Every batch from the loader's position on, across epochs (a DistributedSampler told each epoch)."""
    while True:
        if isinstance(getattr(loader, "sampler", None), DistributedSampler):
            loader.sampler.set_epoch(epoch)
        if isinstance(loader, ResumableLoader):
            while True:
                x, y, _ = loader.next()
                yield x, y
        yield from loader
        epoch += 1


def train(
    kind: str, location: str | Path, losses: Path, steps: int, async_save: bool, world_change: str = "refuse"
) -> None:
    torch.manual_seed(0)
    data = torch.randn(SAMPLES, 8, generator=torch.Generator().manual_seed(1))
    targets = data.sum(dim=1, keepdim=True).sin()
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = make_loader(kind, data, targets)
    ckpt = CheckpointManager(
        location,
        model=model,
        optimizer=optimizer,
        loader=loader,
        every=5,
        async_save=async_save,
        world_change=world_change,
    )
    step = ckpt.load()
    stream = batches(loader, ckpt.epoch)
    source = loader if isinstance(loader, ResumableLoader) else getattr(loader, "batch_sampler", None)
    micro_batches = source.accumulation if isinstance(source, ResumableLoader | GlobalSampler) else 1
    while step < steps:
        optimizer.zero_grad()
        for _ in range(micro_batches):
            x, y = next(stream)
            loss = nn.functional.mse_loss(model(x), y) / micro_batches
            loss.backward()
        optimizer.step()
        step += 1
        with losses.open("a") as out:
            out.write(json.dumps({"step": step, "loss": loss.item()}) + "\n")
        if ckpt.due(step):
            epoch = (
                loader.sampler.epoch
                if isinstance(getattr(loader, "sampler", None), DistributedSampler)
                else 0
            )
            ckpt.save(step, epoch)
    ckpt.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--loader", choices=("stateful", "stateful-shuffle", "global", "own"), required=True)
    parser.add_argument("--location", required=True)  # a str: Path would make s3:// into s3:/
    parser.add_argument("--losses", type=Path, required=True)
    parser.add_argument("--reference", type=Path, nargs=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--async-save", action="store_true")
    parser.add_argument("--world-change", choices=("refuse", "warn"), default="refuse")
    args = parser.parse_args()
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
    try:
        train(args.loader, args.location, args.losses, args.steps, args.async_save, args.world_change)
    except ResumeRefused as exc:
        if not dist.is_initialized() or dist.get_rank() == 0:
            print(f"loader_job: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    if args.reference:
        train(args.loader, args.reference[0], args.reference[1], args.steps, args.async_save)


if __name__ == "__main__":
    run_then_exit(main)
