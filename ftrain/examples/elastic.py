"""A DDP script that trains the same on any world size: a global batch, a global data position, and randomness
keyed by the sample, so a run resumed on fewer or more ranks sees every step's samples as if it had never
stopped.

    torchrun --nproc-per-node 4 -m ftrain.examples.elastic --location ./ckpt/elastic --steps 8
    torchrun --nproc-per-node 2 -m ftrain.examples.elastic --location ./ckpt/elastic --steps 16

The script names the global batch and the micro-batch one rank holds; ftrain's `GlobalSampler` gives each rank
its slice of every global batch from the saved position, and each rank accumulates over as many micro-batches
as this world needs (`micro_batches`). Dropout masks come from a generator per sample, keyed by (seed, step,
sample id). `--record DIR` writes the ids each rank trained at each step and rank 0's final parameters.
"""

import argparse
import hashlib
import json
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from ftrain.train.checkpointing import CheckpointManager
from ftrain.train.process_exit import run_then_exit
from ftrain.train.sampler import GlobalSampler, sample_uniform

SAMPLES, FEATURES, HIDDEN, DROPOUT, SEED = 512, 16, 64, 0.2, 0


class Net(nn.Module):
    """Two layers with dropout between them, its mask given by the caller (one per sample)."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(FEATURES, HIDDEN), nn.Linear(HIDDEN, 1)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        hidden: torch.Tensor = torch.tanh(self.first(x)) * keep / (1 - DROPOUT)
        return self.second(hidden)  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--location", help="a directory or s3://bucket/prefix/<run> (ftrain run sets it)")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--global-batch", type=int, default=32, help="samples per optimizer step, all ranks")
    parser.add_argument("--micro-batch", type=int, default=4, help="samples per forward pass on one rank")
    parser.add_argument("--record", type=Path, help="write the ids trained per step and the final parameters")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(SEED)
    inputs = torch.randn(SAMPLES, FEATURES, generator=torch.Generator().manual_seed(1))
    dataset = TensorDataset(torch.arange(SAMPLES), inputs, inputs.sum(dim=1, keepdim=True).sin())
    model = DistributedDataParallel(Net())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    # ftrain: the global batch and the data position are the run's, whatever its world
    sampler = GlobalSampler(len(dataset), args.global_batch, micro_batch=args.micro_batch, seed=SEED)
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=1)
    ckpt = CheckpointManager(args.location, model=model, optimizer=optimizer, loader=loader, every=4)
    step = ckpt.load()
    micro_batches = ckpt.micro_batches(args.global_batch, args.micro_batch)
    batches = iter(loader)
    while step < args.steps:
        trained: list[int] = []
        total = torch.zeros(())
        for i in range(micro_batches):
            ids, x, y = next(batches)
            keep = sample_uniform(SEED, step, ids, (HIDDEN,)) >= DROPOUT  # the sample's own dropout mask
            with model.no_sync() if i < micro_batches - 1 else nullcontext():
                loss = nn.functional.mse_loss(model(x, keep), y) * sampler.loss_scale(len(ids))
                loss.backward()
            trained += ids.tolist()
            total += loss.detach()
        optimizer.step()
        optimizer.zero_grad()
        step += 1
        if args.record is not None:
            dist.all_reduce(total)  # the global batch's mean loss, world × (each rank's scaled sum)
            with (args.record / f"ids-{rank}.jsonl").open("a") as out:
                line = {"step": step, "world": world, "ids": trained, "loss": total.item() / world}
                out.write(json.dumps(line) + "\n")
        if ckpt.due(step):
            ckpt.save(step, sampler.position().epoch)
    ckpt.close()

    params = [p.detach() for p in model.parameters()]
    if rank == 0:
        digest = hashlib.sha256(b"".join(p.numpy().tobytes() for p in params)).hexdigest()
        if args.record is not None:
            (args.record / "params.json").write_text(json.dumps([p.flatten().tolist() for p in params]))
        print(f"FINAL step={step} params_sha256={digest}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    run_then_exit(main)  # exits without the interpreter's teardown, which races gloo's threads
