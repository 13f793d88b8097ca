"""A 2-rank job for the S3 resume tests, run under torchrun: it saves the reference trainer's state (debug
model, FSDP2, one AdamW step) to `s3://…`, then loads it into a model built from another seed over the same data, and prints
both parameter digests. `--layout per-rank` gives each rank a work directory of its own, as two nodes with
one rank each would have: a rank's load then needs files only the other rank's node holds."""

import argparse
import logging
from pathlib import Path

import torch
import torch.distributed as dist

from ftrain.examples.data import ResumableLoader, synthetic_tokens
from ftrain.examples.train import build_model, model_config, params_digest, parse_args
from ftrain.logs import configure
from ftrain.train.checkpointing import CheckpointManager
from ftrain.train.config import CheckpointConfig
from ftrain.train.process_exit import run_then_exit
from ftrain.train.state import TrainState
from ftrain.workers.storage.location import run_location

DATA_SEED = 1


def state(seed: int) -> TrainState:
    """The reference trainer's state after one AdamW step from a model built from `seed`."""
    rank, world = dist.get_rank(), dist.get_world_size()
    args = parse_args(["--ckpt-dir", "unused", "--model", "debug", "--seed", str(seed)])
    config = model_config(args)
    model = build_model(config, args, torch.device("cpu"), rank)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    loader = ResumableLoader(  # one dataset and order: a resume refuses another (see the loader's state)
        synthetic_tokens(64, config["seq"] + 1, config["vocab"], DATA_SEED), 4, rank, world, DATA_SEED
    )
    inputs, targets, _ = loader.next()
    model(inputs, targets).backward()
    optimizer.step()
    scheduler.step()
    return TrainState(model, optimizer, {"scheduler": scheduler, "loader": loader}, rank)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--object-dir", required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--layout", choices=("shared", "per-rank"), required=True)
    args = parser.parse_args()
    configure(logging.INFO)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    work = args.work / (f"node-{rank}" if args.layout == "per-rank" else "node")
    config = CheckpointConfig(location=run_location(args.object_dir), stage_dir=work)
    saved = state(seed=1)
    saved.step = 7
    manager = CheckpointManager.from_config(config, saved)
    manager.save(7, 0)
    manager.close()
    before = params_digest(saved.model)

    loaded = state(seed=2)
    manager = CheckpointManager.from_config(config, loaded)
    step = manager.load()
    manager.close()
    after = params_digest(loaded.model)
    if rank == 0:
        print(f"SAVED {before} LOADED {after} STEP {step if manager.resumed else None}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    run_then_exit(main)  # a torchrun worker ends like the trainer: see ftrain.train.process_exit
