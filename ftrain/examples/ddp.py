"""A plain-DDP training script protected by ftrain: resumed exactly, wherever it is stopped.

    torchrun --nproc-per-node 2 -m ftrain.examples.ddp --location ./ckpt/ddp-demo
    ftrain run ddp-demo --nodes 1 --gpus-per-node 2 -- python -m ftrain.examples.ddp

Each batch is derived from the step and the rank, so the data needs no saved position. At the end rank 0
prints `FINAL step=N loss=… params_sha256=…`: the same after any number of kills and resumes.
"""

import argparse
import hashlib

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ftrain.train.checkpointing import CheckpointManager
from ftrain.train.process_exit import run_then_exit


def batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step `step`'s batch for `rank`: a function of both, so a resume sees the same data."""
    inputs = torch.randn(32, 16, generator=torch.Generator().manual_seed(step * world + rank))
    return inputs, inputs.sum(dim=1, keepdim=True).sin()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--location", help="a directory or s3://bucket/prefix/<run> (ftrain run sets it)")
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.5)

    # ftrain: name what shapes training, load, save when due, and save the end
    ckpt = CheckpointManager(
        args.location, model=model, optimizer=optimizer, states={"scheduler": scheduler}, every=10
    )
    step = ckpt.load()
    while step < args.steps:
        inputs, targets = batch(step, rank, world)
        loss = nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        step += 1
        if ckpt.due(step):
            ckpt.save(step)
    ckpt.save(step, final=True)  # the end state is the run's last checkpoint (skipped if just saved)
    ckpt.close()

    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
    if rank == 0:
        print(f"FINAL step={step} loss={loss.item():.4f} params_sha256={digest.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    run_then_exit(main)  # exits without the interpreter's teardown, which races gloo's threads
