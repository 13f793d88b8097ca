"""The reference trainer: a small transformer under FSDP2 with ftrain's checkpointing and automatic resume.

    torchrun --nproc-per-node 2 -m ftrain.examples.train --ckpt-dir ./ckpts --save-interval 10 --train-iters 100

Resumes by itself from the newest valid checkpoint (`--no-resume` starts fresh); under `ftrain run` the
checkpoint manager takes the run, its location, cadence and dataset revision from the supervisor. It uses the
public training API only (`ftrain.train.checkpointing`), as any script does. At the end rank 0 prints
`FINAL step=N params_sha256=<hex>`, the SHA-256 of the full unsharded parameters in name order.
"""

import argparse
import hashlib
import os
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from ftrain import settings
from ftrain.examples.data import ResumableLoader, synthetic_tokens
from ftrain.examples.model import MODELS, TinyGPT, parameter_count
from ftrain.host.lifeline import die_with_launcher
from ftrain.logs import configure as configure_logging
from ftrain.train.checkpointing import (
    CheckpointManager,
    Fenced,
    NoValidCheckpoint,
    ResumeFailed,
    ResumeRefused,
    ResumeStopped,
    SavesFailing,
    SaveTimes,
    UnresumableState,
    UnsafeDirectory,
)
from ftrain.train.metrics import MetricsWriter, process_start_time
from ftrain.train.process_exit import run_then_exit

META_INIT_AUTO_PARAMS = 6_000_000_000  # the seed's threshold: dense init stays exact for smaller models
PROCESS_START = process_start_time()


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        _usage(message)


def _usage(message: str) -> NoReturn:
    if os.environ.get("RANK", "0") == "0":
        print(f"train: {message}", file=sys.stderr)
    sys.exit(2)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Flags in the seed's spirit; mistakes are one line and exit 2, before anything is written."""
    try:
        log_level = settings.log_level()
    except settings.InvalidSetting as exc:
        _usage(str(exc))
    p = _Parser(prog="python -m ftrain.examples.train", description=__doc__.split("\n")[0])
    p.add_argument("--ckpt-dir", default=None, help="a directory, or s3://bucket/prefix/<run>")
    p.add_argument("--run-id", default=None)
    p.add_argument("--save-interval", type=int, default=None, help="save every N steps")
    p.add_argument(
        "--checkpoint-every", default=None, help="save every duration (10min, 90s) or count (50steps)"
    )
    p.add_argument("--train-iters", type=int, default=100)
    p.add_argument(
        "--global-batch",
        type=int,
        default=None,
        help="samples per step over all ranks (default: the model's batch × 2); the same on any world",
    )
    p.add_argument(
        "--memory-every",
        type=int,
        default=None,
        help="snapshot to node-local memory every N steps (the memory tier; needs a run id)",
    )
    p.add_argument("--async-ckpt", action="store_true", help="stage to host memory, write and fan out behind")
    p.add_argument("--ckpt-stage-dir", type=Path, default=None, help="node-local staging (async)")
    p.add_argument("--no-resume", action="store_true", help="start fresh instead of resuming")
    p.add_argument("--keep", type=int, default=3, help="complete checkpoints to keep (≥ 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--metrics-dir", type=Path, default=None, help="default: <ckpt-dir>/metrics")
    p.add_argument("--model", choices=sorted(MODELS), default="debug")
    p.add_argument("--layers", type=int, default=None, help="override the model's layer count")
    p.add_argument("--dim", type=int, default=None, help="override the model's width")
    p.add_argument("--meta-init", choices=("auto", "on", "off"), default="auto")
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args(argv)
    args.log_level = log_level
    if args.train_iters < 1:
        _usage("--train-iters must be ≥ 1")
    args.every = args.checkpoint_every or args.save_interval
    return args


def model_config(args: argparse.Namespace) -> dict[str, int]:
    """The chosen model size with any overrides."""
    config = dict(MODELS[args.model])
    config.update({k: v for k, v in (("layers", args.layers), ("dim", args.dim)) if v is not None})
    return config


def build_model(config: dict[str, int], args: argparse.Namespace, device: torch.device, rank: int) -> TinyGPT:
    """FSDP2-sharded model; with meta-init only this rank's shard is ever materialized."""
    meta = args.meta_init == "on" or (
        args.meta_init == "auto" and parameter_count(config) >= META_INIT_AUTO_PARAMS
    )
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    dims = {k: config[k] for k in ("vocab", "dim", "layers", "heads", "seq")}
    with torch.device("meta" if meta else device):
        model = TinyGPT(**dims)
    if not meta:
        model.init_weights(args.seed, rank)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if meta:
        model.to_empty(device=device)
        model.init_weights(args.seed, rank)
    return model


def params_digest(model: torch.nn.Module) -> str | None:
    """Rank 0: SHA-256 over the full unsharded parameters, in name order (name, dtype, shape, bytes). One
    parameter is gathered at a time, so a model too big for one process (meta-init) can still be hashed."""
    digest = hashlib.sha256() if dist.get_rank() == 0 else None
    for name, param in sorted(model.named_parameters()):
        full = param.full_tensor() if isinstance(param, DTensor) else param
        if digest is not None:
            tensor = full.detach().cpu().contiguous()
            digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
            digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
        del full
    return digest.hexdigest() if digest is not None else None


def _ckpt_metrics(times: SaveTimes, async_ckpt: bool) -> dict[str, float]:
    if async_ckpt:
        return {
            "train/ckpt_stage_seconds": times.stage_seconds,
            "train/ckpt_drain_seconds": times.drain_seconds,
        }
    return {"train/ckpt_save_seconds": times.save_seconds}


def training_device() -> tuple[torch.device, str]:
    """This rank's device and the training group's backend: its own GPU (`cuda:LOCAL_RANK`) and nccl when CUDA
    is visible, else the CPU and gloo (checkpoint collectives get a gloo group of their own either way).

    On CUDA, kernels are made deterministic: bit-identical resume means recomputing the lost steps gives the
    same bits, which atomics-based kernels and cuBLAS's default workspace do not promise; an op with no
    deterministic kernel warns, naming itself, and training goes on. A rank without a GPU of its own exits 2
    (nccl refuses two ranks on one device)."""
    if not torch.cuda.is_available():
        return torch.device("cpu"), "gloo"
    local_rank, visible = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
    if local_rank >= visible:
        print(
            f"train: local rank {local_rank} has no GPU of its own ({visible} visible): "
            f"start at most {visible} processes per node",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(2)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS first runs
    torch.use_deterministic_algorithms(True, warn_only=True)
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    return device, "nccl"


def train(args: argparse.Namespace) -> int:
    """Set up, resume, train to `--train-iters`, checkpointing on schedule; returns the exit code."""
    device, backend = training_device()
    dist.init_process_group(backend, timeout=timedelta(minutes=10))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    config = model_config(args)
    model = build_model(config, args, device, rank)
    optimizer: torch.optim.Optimizer = (
        torch.optim.AdamW(model.parameters(), lr=args.lr)
        if args.optimizer == "adamw"
        else torch.optim.SGD(model.parameters(), lr=args.lr)
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 20))
    data = synthetic_tokens(4096, config["seq"] + 1, config["vocab"], args.seed)
    global_batch = args.global_batch or 2 * config["batch"]
    try:
        loader = ResumableLoader(data, config["batch"], rank, world, args.seed, global_batch=global_batch)
    except ValueError as exc:
        dist.destroy_process_group()
        _usage(f"--global-batch: {exc}")
    try:
        manager = CheckpointManager(
            args.ckpt_dir,
            model=model,
            optimizer=optimizer,
            states={"scheduler": scheduler},
            loader=loader,
            every=args.every,
            keep=args.keep,
            async_save=args.async_ckpt,
            stage_dir=args.ckpt_stage_dir,
            resume=not args.no_resume,
            run_id=args.run_id,
            dataset_revision=f"synthetic-v1-seed{args.seed}",
            memory_every=args.memory_every,
        )
    except ValueError as exc:
        dist.destroy_process_group()
        _usage(str(exc))
    try:
        return _loop(args, manager, scheduler, loader, model, optimizer, device)
    except (NoValidCheckpoint, ResumeFailed, ResumeStopped, UnsafeDirectory, SavesFailing) as exc:
        _say(rank, f"train: {exc}")
        return 1
    except UnresumableState as exc:  # refused at a save, before anything was written
        _say(rank, f"train: {exc}")
        return 1
    except ResumeRefused as exc:
        _say(rank, f"train: {exc}")
        return 2
    except Fenced as exc:  # a newer attempt took over while this one was stopped or cut off
        _say(rank, f"train: {exc}")
        return 1
    finally:
        manager.close()
        dist.destroy_process_group()


def _loop(
    args: argparse.Namespace,
    manager: CheckpointManager,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    loader: ResumableLoader,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
) -> int:
    rank = dist.get_rank()
    step = manager.load()
    metrics_dir = (
        args.metrics_dir
        or (
            manager.config.location.path
            if manager.config.location.backend == "file"
            else manager.config.stage_dir
        )
        / "metrics"
    )
    metrics = MetricsWriter(metrics_dir.expanduser().absolute(), rank)
    first_after_resume = manager.resumed is not None
    try:
        while step < args.train_iters:
            start = time.perf_counter()
            loss = torch.zeros((), device=device)
            for _ in range(loader.accumulation):  # more micro-batches on a smaller world, fewer on a larger
                inputs, targets, scale = loader.next()
                micro = model(inputs.to(device), targets.to(device)) * scale
                micro.backward()
                loss += micro.detach()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            step += 1
            record: dict[str, Any] = {
                "train/iter": step,
                "train/loss": loss.item(),
                "train/dt": time.perf_counter() - start,
            }
            if first_after_resume:
                record["train/restart_seconds"] = time.time() - PROCESS_START
                if manager.lost is not None:
                    record["train/lost_steps"] = manager.lost[0]
                first_after_resume = False
            metrics.write(record)
            if manager.due(step):
                times = manager.save(step, loader.epoch)
                metrics.write({"train/iter": step, **_ckpt_metrics(times, args.async_ckpt)})
            elif manager.snapshot_stall is not None:
                metrics.write({"train/iter": step, "train/memory_stage_seconds": manager.snapshot_stall})
        manager.save(step, loader.epoch, final=True)  # the end state, once (skipped when just saved)
        drain = manager.close()
        if args.async_ckpt:
            metrics.write({"train/ckpt_drain_seconds": drain, "final": True})
    finally:
        metrics.close()
    digest = params_digest(model)
    if digest is not None:
        print(f"FINAL step={step} params_sha256={digest}", flush=True)
    return 0


def _say(rank: int, line: str) -> None:
    if rank == 0:
        print(line, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for torchrun."""
    die_with_launcher()
    args = parse_args(argv)
    configure_logging(args.log_level)
    return train(args)


if __name__ == "__main__":
    run_then_exit(main)
