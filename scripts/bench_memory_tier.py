"""Benchmark the memory tier against the durable one, side by side in one run: what a snapshot stalls the
training loop for against the copy floor and a sync durable save, and what a restart's load costs from node
memory against durable storage.

Run: ``.venv/bin/python scripts/bench_memory_tier.py [--model 85m] [--rounds 5] [--digest sha256|blake3]
[--dir DIR] [--memory-dir /dev/shm] [--json out.json]``. One process (a gloo group of one), the reference trainer's model and AdamW after
one step (``85m``: ≈ 1 GB of state), built as ``scripts/bench_checkpoint.py`` builds it. Each round, interleaved
so machine noise hits every figure alike (one warm-up round not counted; medians over the rest):

1. copy floor: ``copy_`` of the state's bytes into a preallocated buffer of that size;
2. snapshot stall: ``MemoryTier.take``, what the loop waits for: ``state_dict()`` (also timed alone, just
   before) and the copy into the tier's staging buffers; then its background part (DCP write to the tmpfs,
   every file hashed, sealed) to the end;
3. sync durable save: ``CheckpointManager.save`` to ``--dir`` (fsync'd, hashed, sealed): what the loop waits
   for without the tier, or at every durable save;
4. restart load from memory: ``resume_from_memory`` of that snapshot (every file hashed against the manifest,
   ``.metadata`` verified then parsed, DCP load through the allowlist);
5. restart load from durable storage: ``CheckpointManager.load`` of that checkpoint (marker, manifest, every
   file hashed, DCP load), cold (its pages dropped with ``posix_fadvise(DONTNEED)``) and cached.

Durable storage here is this machine's local disk: a shared file system or object store behind a network is
slower, so the load ratios are a lower bound of what the tier saves there.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import torch
import torch.distributed as dist
from bench_checkpoint import build_state, evict
from torch._C._distributed_c10d import HashStore

from ftrain.domain.lifecycle import SnapshotRef
from ftrain.events.schema import Snapshotted
from ftrain.train.checkpointing import CheckpointManager
from ftrain.train.config import CheckpointConfig
from ftrain.train.memory_resume import resume_from_memory
from ftrain.train.snapshots import MemoryTier
from ftrain.workers.integrity import ALGORITHM, ALGORITHMS
from ftrain.workers.layout import step_dir
from ftrain.workers.manifest import FileEntry, Manifest
from ftrain.workers.memory_tier import memory_root
from ftrain.workers.staging import local_bytes
from ftrain.workers.storage.location import run_location

RUN = "bench-memory"
FIGURES = ("copy floor", "state_dict() alone", "snapshot stall", "snapshot in background", "sync durable save",
           "load from memory", "load from durable, cold", "load from durable, cached")  # fmt: skip


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="85m")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--dir", type=Path, default=None, help="durable storage (default: a temporary directory)"
    )
    parser.add_argument("--memory-dir", type=Path, default=Path("/dev/shm"))
    parser.add_argument("--digest", choices=ALGORITHMS, default=ALGORITHM, help="the data files' digest")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        base = Path(scratch)
        result = run(args, base)
    dist.destroy_process_group()
    print_table(result)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


def run(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    state, params = build_state(args.model, base)
    state_bytes = local_bytes(state.state_dict())
    root = memory_root(args.memory_dir, f"{RUN}-{os.getpid()}")
    config = CheckpointConfig(
        location=run_location(base / RUN), stage_dir=base / "stage", keep=2, digest=args.digest
    )
    durable = CheckpointManager.from_config(config, state)
    assert durable.load() == 0
    tier_config = msgspec.structs.replace(config, run_id=RUN, memory_every=1, memory_root=root)
    recorded: list[Snapshotted] = []
    tier = MemoryTier(
        tier_config,
        lambda step, epoch, files: manifest_of(step, epoch, files),
        lambda event: recorded.append(event) if isinstance(event, Snapshotted) else None,
    )
    tier.ready()
    source, floor_buffer = (
        torch.empty(state_bytes, dtype=torch.uint8),
        torch.empty(state_bytes, dtype=torch.uint8),
    )
    samples: dict[str, list[float]] = {name: [] for name in FIGURES}

    try:
        for step in range(1, args.rounds + 2):
            state.step = step
            one = {
                "copy floor": timed(lambda: floor_buffer.copy_(source)),
                "state_dict() alone": timed(state.state_dict),
                "snapshot stall": timed(partial(tier.take, step, 0, state.state_dict, attempt=1)),
                "snapshot in background": timed(tier.wait),
                "sync durable save": timed(partial(durable.save, step)),
            }
            assert recorded and recorded[-1].step == step, "the snapshot was not sealed"
            one["load from memory"] = timed(
                lambda: resume_from_memory(tier, SnapshotRef(recorded=recorded[-1]), state, None, 1, RUN)
            )
            evict(step_dir(base / RUN, step))
            one["load from durable, cold"] = timed(durable.load)
            one["load from durable, cached"] = timed(durable.load)
            if step > 1:  # the first round warms up
                for name, seconds in one.items():
                    samples[name].append(seconds)
    finally:
        tier.close(completed=True)
        durable.close()
    medians = {name: statistics.median(values) for name, values in samples.items()}
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{platform.node()} ({os.cpu_count()} cores, {platform.processor() or platform.machine()})",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "model": args.model,
        "digest": args.digest,
        "params": params,
        "state_bytes": state_bytes,
        "rounds": args.rounds,
        "median_seconds": medians,
        "samples": samples,
        "ratios": {
            "snapshot stall / copy floor": medians["snapshot stall"] / medians["copy floor"],
            "sync durable save / snapshot stall": medians["sync durable save"] / medians["snapshot stall"],
            "load from durable, cold / load from memory": medians["load from durable, cold"]
            / medians["load from memory"],
            "load from durable, cached / load from memory": medians["load from durable, cached"]
            / medians["load from memory"],
        },
    }


def manifest_of(step: int, epoch: int, files: list[FileEntry]) -> Manifest:
    return Manifest(run_id=RUN, step=step, epoch=epoch, shards=1, world_size=1, dataset_revision=None,
                    created_at=datetime.now(UTC), files=tuple(sorted(files, key=lambda e: e.name)))  # fmt: skip


def print_table(result: dict[str, Any]) -> None:
    gb = result["state_bytes"] / 1e9
    print(f"{result['date']} {result['machine']}: model {result['model']}, {gb:.2f} GB of state, {result['digest']}, "
          f"{result['rounds']} rounds (medians)")  # fmt: skip
    for name, seconds in result["median_seconds"].items():
        print(f"  {name:<28} {seconds:8.3f} s   {gb / seconds:6.2f} GB/s")
    for name, ratio in result["ratios"].items():
        print(f"  {name:<46} {ratio:6.2f}x")


if __name__ == "__main__":
    raise SystemExit(main())
