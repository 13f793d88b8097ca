"""Benchmark ftrain's checkpoint save and resume against raw torch.distributed.checkpoint, side by side.

Run: ``.venv/bin/python scripts/bench_checkpoint.py [--model 85m] [--repeats 3] [--dir DIR] [--json out.json]
[--device cpu|cuda] [--state-gb GB | --layers N --dim D] [--nproc N] [--no-gathered]``; with ``--storage s3://BUCKET[/PREFIX]`` it hands over to ``scripts/bench_s3.py`` (S3, on a
throwaway SeaweedFS). It relaunches itself under torchrun with 2 CPU ranks (gloo; ``--nproc``), or with ``--device cuda``
one rank per visible GPU, at most 2 (``--nproc``), each rank's shard on its own GPU (nccl for FSDP, gloo for the benchmark's own
bookkeeping and ftrain's checkpoint group); the workers build the reference trainer's FSDP2 model (``85m``:
model + AdamW state ≈ 1 GB; ``--state-gb`` picks the layers and width nearest a state size, for
``scripts/bench_scaling.py``'s grid), take one optimizer step so the AdamW state exists, then measure:

1. saves, interleaved per round (raw ``dcp.save``, ``torch.save`` of the gathered state, ``dcp.async_save``
   with its defaults, ftrain sync and ftrain async, each once with SHA-256 and once with BLAKE3 as the data
   files' digest, ``FTRAIN_DIGEST``'s two choices) so machine noise hits every method alike, after one
   warm-up round that is not counted; each save goes to a fresh directory that is deleted (then ``sync``)
   once measured; figures are medians over the rounds;
2. the copy floor, each round right before the ftrain async save: ``copy_`` bandwidth into a preallocated
   tensor of each rank's state size (on CUDA: from the GPU into pinned host memory, as the stage copies),
   all ranks at once as in the real stage; floor = the rank's state bytes ÷ that bandwidth (the slower rank);
3. resume: ``CheckpointManager.load()`` (marker, manifest, then ``dcp.load`` reading each shard's chunks as
   they are verified: manifest format 3; a checkpoint of format 2 is hashed whole first) of
   the last ftrain sync checkpoint of each digest vs raw ``dcp.load`` of the last raw ``dcp.save`` one, all written
   earlier in the run: cold (their pages dropped with ``posix_fadvise(DONTNEED)``, possible because they were
   fsync'd) and cached (read again right after).

Blocking is the time the training loop waits; durable + finalized is until the data is fsync'd (and, for
ftrain, the manifest, marker and rename are done on rank 0), barrier to barrier, so the slowest rank counts.
CPU-s is every rank's CPU time in the operation, all threads, summed: against the machine's cores it bounds how
fast ftrain's extra work (the digests) could go here, and the report prints that bound beside the ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from bench_events import fs_type
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from ftrain.examples.data import ResumableLoader, synthetic_tokens
from ftrain.examples.model import MODELS, parameter_count
from ftrain.examples.train import build_model, model_config, parse_args
from ftrain.logs import configure as configure_logs
from ftrain.train.checkpointing import CheckpointManager
from ftrain.train.config import CheckpointConfig
from ftrain.train.process_exit import run_then_exit
from ftrain.train.state import TrainState
from ftrain.workers.layout import step_dir
from ftrain.workers.staging import local_bytes
from ftrain.workers.storage.location import run_location

WORLD = 2  # ranks on CPU; on CUDA one per GPU, at most this many
CPU = torch.device("cpu")
GB = 1e9
RAW, GATHERED, ASYNC, FT_SYNC, FT_ASYNC, FT_SYNC_B3, FT_ASYNC_B3 = (
    "raw dcp.save",
    "torch.save gathered",
    "dcp.async_save (default)",
    "ftrain sync",
    "ftrain async",
    "ftrain sync, blake3",
    "ftrain async, blake3",
)
METHODS = (RAW, GATHERED, ASYNC, FT_SYNC, FT_SYNC_B3, FT_ASYNC, FT_ASYNC_B3)
DIGESTS = {"sha256": (FT_SYNC, FT_ASYNC), "blake3": (FT_SYNC_B3, FT_ASYNC_B3)}
"""Each digest of the data files (`FTRAIN_DIGEST`), with the ftrain saves that use it (unsuffixed: SHA-256,
the default, whose rows the targets have always read)."""
STATE_BYTES_PER_PARAM = 12  # fp32 parameter + AdamW's two fp32 moments (the step counters are negligible)
RAW_LOAD, FT_LOAD, FT_LOAD_B3 = "raw dcp.load", "ftrain load() (verify + load)", "ftrain load(), blake3"
LOADS = {FT_SYNC: FT_LOAD, FT_SYNC_B3: FT_LOAD_B3}
"""The load of each ftrain sync save's checkpoint."""
COPY_REPEATS = 5


# ----------------------------------------------------------------------------------------------- helpers


def worst(value: float) -> float:
    """The largest `value` over the ranks (the slowest rank is the one training waits for)."""
    box = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(box, op=dist.ReduceOp.MAX)
    return float(box.item())


def total(value: int) -> int:
    """The sum of `value` over the ranks."""
    box = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(box)
    return int(box.item())


def summed(value: float) -> float:
    """The sum of `value` over the ranks."""
    box = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(box)
    return float(box.item())


def dir_bytes(path: Path) -> int:
    """Bytes of the files under `path`."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def evict(path: Path) -> None:
    """Drop `path`'s files from the page cache (their pages are clean: fsync'd), so the next read hits the disk."""
    for file in path.rglob("*"):
        if file.is_file():
            fd = os.open(file, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def host_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """`src` into host memory `dst` as the stage copies: from a GPU, a non-blocking DMA into pinned memory, then
    a wait for it."""
    cuda = src.device.type == "cuda"
    dst.copy_(src, non_blocking=cuda)
    if cuda:
        torch.cuda.synchronize()


def median(values: Sequence[float]) -> float:
    """Median, NaN for no values."""
    return statistics.median(values) if values else float("nan")


def sized(model_name: str, state_gb: float) -> tuple[int, int]:
    """(layers, width) of `model_name` whose model + AdamW state is nearest `state_gb`: the reference model's
    own shapes, only deeper or wider, so a size grid measures the same kind of state at each size. Widths are
    multiples of 128 (every registry head count divides them); any within 2 % of the target will do, and then
    the one nearest the model's own width wins, so the tensors differ from size to size as little as can be."""
    config = dict(MODELS[model_name])
    target = state_gb * GB / STATE_BYTES_PER_PARAM  # parameters
    best: tuple[tuple[bool, float], int, int] | None = None
    for dim in range(128, 8193, 128):
        fixed = parameter_count(config | {"dim": dim, "layers": 0})
        block = parameter_count(config | {"dim": dim, "layers": 1}) - fixed
        layers = max(1, round((target - fixed) / block))
        error = abs(fixed + layers * block - target) / target
        key = (error > 0.02, abs(dim - config["dim"]) if error <= 0.02 else error)
        if best is None or key < best[0]:
            best = (key, layers, dim)
    assert best is not None
    return best[1], best[2]


@dataclass
class Samples:
    """One method's per-round figures (seconds; bytes on disk)."""

    blocking: list[float] = field(default_factory=list)
    durable: list[float] = field(default_factory=list)
    disk_bytes: list[int] = field(default_factory=list)
    extra: list[float] = field(default_factory=list)  # gather (torch.save) or the save() call (ftrain async)
    cpu: list[float] = field(default_factory=list)  # CPU time of all ranks, every thread, barrier to barrier


# -------------------------------------------------------------------------------------------- the saves


def build_state(
    model_name: str, base: Path, device: torch.device = CPU, shape: Sequence[str] = ()
) -> tuple[TrainState, int]:
    """This rank's reference-trainer state (FSDP2 model on `device`, AdamW after one step, scheduler, loader)
    and the model's parameter count over the ranks; `shape`: the trainer's `--layers`/`--dim` overrides."""
    rank = dist.get_rank()
    train_args = parse_args(["--ckpt-dir", str(base / "unused"), "--model", model_name, *shape])
    config = model_config(train_args)
    model = build_model(config, train_args, device, rank)
    optimizer = torch.optim.AdamW(model.parameters(), lr=train_args.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    data = synthetic_tokens(256, config["seq"] + 1, config["vocab"], train_args.seed)
    loader = ResumableLoader(data, config["batch"], rank, dist.get_world_size(), train_args.seed)
    inputs, targets, _ = loader.next()
    # one step, so the AdamW moments exist and are saved
    model(inputs.to(device), targets.to(device)).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    scheduler.step()
    params = total(sum(local_bytes(p) // p.element_size() for p in model.parameters()))
    return TrainState(model, optimizer, {"scheduler": scheduler, "loader": loader}, rank), params


class Bench:
    """One rank's side of the benchmark: the training state, an ftrain sync and async manager per digest, the
    directories."""

    def __init__(
        self,
        model_name: str,
        base: Path,
        device: torch.device,
        shape: Sequence[str],
        methods: Sequence[str],
        stage_dir: Path,
    ) -> None:
        self.rank = dist.get_rank()
        self.base = base
        self.device = device
        self.methods = tuple(methods)
        self.state, self.params = build_state(model_name, base, device, shape)
        self.rank_bytes = local_bytes(self.state.state_dict())
        self.state_bytes = total(self.rank_bytes)
        self.dirs: dict[str, Path] = {}
        self.managers: dict[str, CheckpointManager] = {}
        for digest, (sync, async_) in DIGESTS.items():
            for method, staged in ((sync, False), (async_, True)):
                self.dirs[method] = base / method.replace(" ", "-").replace(",", "")
                config = CheckpointConfig(
                    location=run_location(self.dirs[method]),
                    async_save=staged,
                    stage_dir=stage_dir,
                    digest=digest,
                )
                self.managers[method] = CheckpointManager.from_config(config, self.state)
        self.async_ = self.managers[FT_ASYNC]
        for manager in self.managers.values():  # start-up as a job's: the async pipeline picks its way here
            assert manager.load() == 0
        self.step = 0
        self.samples = {m: Samples() for m in self.methods}
        self.floors: list[float] = []
        self.copy_gbps: list[float] = []
        self.kept: dict[str, tuple[int, Path]] = {}  # method -> (step, directory) of the checkpoint kept

    def close(self) -> None:
        """Stop the managers' pipelines."""
        for manager in self.managers.values():
            manager.close()

    # -- one save of each kind: returns (blocking seconds or None = all of it, extra, where it went) -------

    def raw_save(self) -> tuple[float | None, float, Path]:
        target = self.base / "raw" / f"save-{self.step}"
        dcp_save({"app": self.state}, checkpoint_id=target)
        return None, 0.0, target

    def gathered_save(self) -> tuple[float | None, float, Path]:
        target = self.base / "gathered" / f"save-{self.step}"
        start = time.perf_counter()
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full = {
            "model": get_model_state_dict(self.state.model, options=options),
            "optim": get_optimizer_state_dict(self.state.model, self.state.optimizer, options=options),
            **{name: value.state_dict() for name, value in self.state.states.items()},
        }
        gather = time.perf_counter() - start
        if self.rank == 0:
            target.mkdir(parents=True)
            with open(target / "state.pt", "xb") as f:
                torch.save(full, f)
                f.flush()
                os.fsync(f.fileno())
        return None, gather, target

    def async_save(self) -> tuple[float | None, float, Path]:
        target = self.base / "async" / f"save-{self.step}"
        start = time.perf_counter()
        response = dcp_async_save({"app": self.state}, checkpoint_id=target)
        blocking = time.perf_counter() - start
        upload = response if isinstance(response, Future) else response.upload_completion
        cast(Future[Any], upload).result()
        return blocking, 0.0, target

    def ftrain_sync(self, method: str) -> tuple[float | None, float, Path]:
        self.managers[method].save(self.step, 0)
        return None, 0.0, step_dir(self.dirs[method], self.step)

    def ftrain_async(self, method: str) -> tuple[float | None, float, Path]:
        manager = self.managers[method]
        start = time.perf_counter()
        times = manager.save(self.step, 0)
        call = time.perf_counter() - start
        manager.drain()
        return times.stage_seconds, call, step_dir(self.dirs[method], self.step)

    def measure(self, method: str, record: bool, keep: bool = False) -> None:
        """One save, barrier to barrier; then the directory is deleted (unless `keep`) and the disk settled."""
        op: Callable[[], tuple[float | None, float, Path]] = {
            RAW: self.raw_save,
            GATHERED: self.gathered_save,
            ASYNC: self.async_save,
            FT_SYNC: partial(self.ftrain_sync, FT_SYNC),
            FT_ASYNC: partial(self.ftrain_async, FT_ASYNC),
            FT_SYNC_B3: partial(self.ftrain_sync, FT_SYNC_B3),
            FT_ASYNC_B3: partial(self.ftrain_async, FT_ASYNC_B3),
        }[method]
        self.step += 1
        dist.barrier()
        start, cpu = time.perf_counter(), time.process_time()
        blocking, extra, target = op()
        cpu = time.process_time() - cpu
        dist.barrier()
        durable, cpu = worst(time.perf_counter() - start), summed(cpu)
        blocking = durable if blocking is None else worst(blocking)
        extra = worst(extra)
        size = dir_bytes(target) if self.rank == 0 else 0
        if self.rank == 0:
            if not keep:
                shutil.rmtree(target)
            os.sync()  # no write-back of this save may slow the next one
        dist.barrier()
        if keep:
            self.kept[method] = (self.step, target)
        if record:
            s = self.samples[method]
            s.blocking.append(blocking)
            s.durable.append(durable)
            s.disk_bytes.append(size)
            s.extra.append(extra)
            s.cpu.append(cpu)
        say(
            f"      {method:<26} blocking {blocking:7.3f} s   durable {durable:7.3f} s"
            + ("" if record else "   (warm-up)")
        )

    # -- copy floor ----------------------------------------------------------------------------------------

    def copy_floor(self, record: bool) -> None:
        """`copy_` of this rank's state size into preallocated host memory (pinned, from the GPU, on CUDA), all
        ranks at once (the stage's floor); records the slowest rank's median seconds and that rank's GB/s."""
        cuda = self.device.type == "cuda"
        src = torch.ones(self.rank_bytes, dtype=torch.uint8, device=self.device)
        dst = torch.empty(self.rank_bytes, dtype=torch.uint8, pin_memory=cuda)
        host_copy(dst, src)  # fault the pages in, as the staging buffers are after the first save
        times = []
        for _ in range(COPY_REPEATS):
            dist.barrier()
            start = time.perf_counter()
            host_copy(dst, src)
            times.append(time.perf_counter() - start)
        seconds = median(times)
        del src, dst
        floor, gbps = worst(seconds), -worst(-self.rank_bytes / seconds / GB)
        if record:
            self.floors.append(floor)
            self.copy_gbps.append(gbps)
        say(f"      {'copy floor':<26} {floor:7.3f} s   ({gbps:.2f} GB/s per rank)")

    # -- resume --------------------------------------------------------------------------------------------

    def resume(self, repeats: int) -> dict[str, dict[str, list[float]]]:
        """ftrain `load()` of each kept ftrain sync checkpoint (one per digest; each is checked by the digest its
        manifest names, whatever the loading manager's setting) vs `dcp.load` of the kept raw one, cold and
        cached: each load's wall time, and (`<mode> cpu`) the CPU time all ranks spent in it, every thread
        counted.

        Each ftrain run directory holds exactly that one checkpoint; run_id None is file mode (no log)."""
        raw_dir = self.kept[RAW][1]
        managers = {
            LOADS[method]: CheckpointManager.from_config(
                CheckpointConfig(location=run_location(self.dirs[method]), stage_dir=self.base / "stage"),
                self.state,
            )
            for method in LOADS
        }

        def raw_load() -> None:
            dcp_load({"app": self.state}, checkpoint_id=raw_dir)

        def ftrain_load(name: str, method: str) -> None:
            with contextlib.redirect_stdout(io.StringIO()):  # its "RESUMED from" line
                step = managers[name].load()
            assert managers[name].resumed is not None and step == self.kept[method][0], step

        out: dict[str, dict[str, list[float]]] = {
            m: {"cold": [], "cached": [], "cold cpu": [], "cached cpu": []} for m in (RAW_LOAD, *managers)
        }
        loads: dict[str, tuple[Callable[[], None], Path]] = {RAW_LOAD: (raw_load, raw_dir)}
        for method, name in LOADS.items():
            loads[name] = (partial(ftrain_load, name, method), self.dirs[method])
        for r in range(repeats):
            order = tuple(loads) if r % 2 == 0 else tuple(reversed(loads))
            for mode in ("cold", "cached"):
                for name in order:
                    load, path = loads[name]
                    if mode == "cold" and self.rank == 0:
                        evict(path)
                    dist.barrier()
                    start, cpu = time.perf_counter(), time.process_time()
                    load()
                    cpu = time.process_time() - cpu
                    dist.barrier()
                    seconds, cpu = worst(time.perf_counter() - start), summed(cpu)
                    out[name][mode].append(seconds)
                    out[name][f"{mode} cpu"].append(cpu)
                    say(f"      {name:<30} {mode:<6} {seconds:7.3f} s, {cpu:6.3f} CPU-s")
        for manager in managers.values():
            manager.close()
        return out


# ---------------------------------------------------------------------------------------------- report


def say(line: str) -> None:
    """Progress on rank 0's stdout."""
    if dist.get_rank() == 0:
        print(line, flush=True)


def verdict(ok: bool | None) -> str:
    """How a target row reads (None: a figure shown for reference)."""
    return "" if ok is None else ("met" if ok else "MISSED")


def report(r: dict[str, Any]) -> None:
    """The machine and workload lines, the save table, the resume table, the targets."""
    m = r["machine"]
    print(f"\nftrain checkpoint benchmark, {m['date']}")
    print(
        f"machine: {m['cores']} cores, {m['platform']}, Python {m['python']}, torch {m['torch']}, "
        f"{r['ranks']} ranks on {r['device']} ({r['backend']}, OMP_NUM_THREADS={m['omp_threads']}); "
        f"1-min load average {m['load_start']:.1f} at start, {m['load_end']:.1f} at end (other jobs share the machine)"
    )
    if r["oversubscribed"]:
        print(
            f"OVERSUBSCRIBED: {r['ranks']} CPU ranks on {m['cores']} cores: ranks take turns on the cores, so "
            "every figure includes waiting for one"
        )
    print(
        f"state: model {r['model']} ({r['layers']} layers, width {r['dim']}, {r['params'] / 1e6:.1f}M params) "
        f"+ AdamW, {r['state_bytes'] / GB:.3f} GB "
        f"in {r['ranks']} FSDP2 shards; checkpoints under {r['dir']} ({r['fs']}, same device as the repo: "
        f"{r['same_device_as_repo']})"
    )
    print(
        f"saves: medians of {r['repeats']} interleaved rounds after 1 warm-up round; each save to a fresh "
        "directory, deleted and `sync`ed after"
    )
    if r["model"] == "debug":
        print("debug model: a smoke run; fixed costs dominate, so the ratios mean nothing (use 85m)")
    rows: list[tuple[str, ...]] = [
        ("method", "blocking s", "durable+finalized s", "(min-max)", "GB/s", "CPU-s", "on disk GB", "note")
    ]
    for method in (m for m in METHODS if m in r["saves"]):
        s = r["saves"][method]
        note = ""
        if method == GATHERED:
            note = f"gather {s['extra']:.3f} s (in blocking); rank 0 writes alone"
        elif method in (FT_ASYNC, FT_ASYNC_B3):
            how = "written once" if r["write_once"] else "staged on another device, then copied"
            note = f"blocking = stage_seconds; save() call {s['extra']:.3f} s; {how}"
        elif method == ASYNC:
            note = "blocking = until async_save returns"
        rows.append(
            (
                method,
                f"{s['blocking']:.3f}",
                f"{s['durable']:.3f}",
                f"({min(s['all_durable']):.2f}-{max(s['all_durable']):.2f})",
                f"{r['state_bytes'] / GB / s['durable']:.3f}",
                f"{s['cpu']:.3f}",
                f"{s['disk_bytes'] / GB:.3f}",
                note,
            )
        )
    table(rows)
    source = "from the GPU into pinned host memory, " if r["device"] != "cpu" else ""
    together = {1: "one rank", 2: "both at once"}.get(r["ranks"], "all at once")
    print(
        f"copy floor: {r['copy_gbps']:.2f} GB/s per rank ({source}{together}, measured each round) -> "
        f"{r['copy_floor']:.3f} s for the larger shard ({r['rank_bytes_max'] / GB:.3f} GB)"
    )
    raw, cores = r["saves"][RAW], m["cores"]
    print(
        f"CPU-s: every rank's CPU time, all threads, barrier to barrier. raw dcp.save keeps "
        f"{raw['cpu'] / (cores * raw['durable']) * 100:.0f} % of the {cores} cores busy; "
        + "; ".join(
            f"{method} needs {r['saves'][method]['cpu']:.3f} CPU-s, so its throughput cannot pass "
            f"{1 / cpu_floor(r['saves'][method]['cpu'], cores, raw['durable']):.2f}x raw dcp.save's"
            for method in LOADS
        )
        + " on these cores"
    )
    res = r["resume"]
    print(
        f"\nresume ({r['repeats']} rounds, medians): every checkpoint written earlier in this run; cold = "
        "pages dropped with posix_fadvise(DONTNEED) first, cached = read again straight after"
    )
    rows = [("method", "cold s", "cold CPU-s", "cached s", "cached CPU-s", "cold GB/s", "cached GB/s")]
    for name in (RAW_LOAD, *LOADS.values()):
        cold, cached = res[name]["cold"], res[name]["cached"]
        rows.append(
            (
                name,
                f"{cold:.3f}",
                f"{res[name]['cold cpu']:.3f}",
                f"{cached:.3f}",
                f"{res[name]['cached cpu']:.3f}",
                f"{r['state_bytes'] / GB / cold:.3f}",
                f"{r['state_bytes'] / GB / cached:.3f}",
            )
        )
    table(rows)
    for mode in ("cold", "cached"):
        busy = res[RAW_LOAD][f"{mode} cpu"] / (cores * res[RAW_LOAD][mode])
        print(
            f"{mode}: raw dcp.load keeps {busy * 100:.0f} % of the {cores} cores busy; "
            + "; ".join(
                f"{name} needs {res[name][f'{mode} cpu']:.3f} CPU-s, so it cannot end in under "
                f"{cpu_floor(res[name][f'{mode} cpu'], cores, res[RAW_LOAD][mode]):.2f}x raw dcp.load's time"
                for name in LOADS.values()
            )
            + " on these cores"
        )
    print("\ndigests side by side (ratios against raw dcp.save / raw dcp.load, medians; lower is better)")
    rows = [("digest", "sync durable", "async blocking", "async durable", "resume cold", "resume cached")]
    for digest, (sync, async_) in DIGESTS.items():
        load = res[LOADS[sync]]
        rows.append(
            (
                digest,
                f"{r['saves'][sync]['durable'] / raw['durable']:.2f}x",
                f"{r['saves'][async_]['blocking'] / raw['durable']:.3f}x",
                f"{r['saves'][async_]['durable'] / raw['durable']:.2f}x",
                f"{load['cold'] / res[RAW_LOAD]['cold']:.2f}x",
                f"{load['cached'] / res[RAW_LOAD]['cached']:.2f}x",
            )
        )
    table(rows)
    print("\ntargets")
    rows = [("figure", "value", "target", "")]
    for name, value, target, ok in targets(r):
        rows.append((name, value, target, verdict(ok)))
    table(rows)
    print(f"wall time {r['wall_s']:.1f} s")


def cpu_floor(cpu: float, cores: int, baseline: float) -> float:
    """The least time ÷ `baseline` seconds that work of `cpu` CPU-seconds can take on `cores` cores (spread
    over all of them; 1.0 where it fits beside the baseline's)."""
    return max(1.0, cpu / (cores * baseline))


def targets(r: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    """(figure, value, target, met) for each target: with SHA-256 (the default) the first checkpoint issue's,
    with BLAKE3 the integrity issue's tighter ones, and, for SHA-256, whether each ratio is within 10 % of the
    least its CPU-s allow on these cores (the bound the report prints: as fast as that work can go here). The
    async durable target depends on where the stage directory is: one write when it shares the checkpoints'
    device, a copy otherwise (2.0x)."""
    saves, res, cores = r["saves"], r["resume"], r["machine"]["cores"]
    raw, raw_load = saves[RAW], res[RAW_LOAD]
    out: list[tuple[str, str, str, bool | None]] = []
    for digest, (sync, async_) in DIGESTS.items():
        tight = digest == "blake3"
        throughput = raw["durable"] / saves[sync]["durable"]
        most = 1 / cpu_floor(saves[sync]["cpu"], cores, raw["durable"])  # the throughput its CPU-s allow
        stall = saves[async_]["blocking"]
        durable = saves[async_]["durable"] / raw["durable"]
        durable_limit = (1.2 if tight else 1.5) if r["write_once"] else 2.0
        floor_limit = 1.2 if tight else 1.5
        out += [
            (
                f"{digest}: sync GB/s ÷ raw dcp.save GB/s",
                f"{throughput:.2f}x (cores allow {most:.2f}x)",
                f">= {0.95 if tight else 0.9}x",
                throughput >= (0.95 if tight else 0.9),
            ),
            (
                f"{digest}: async stall ÷ its own sync save",
                f"{stall / saves[sync]['durable']:.3f}x (the copy floor alone {r['copy_floor'] / saves[sync]['durable']:.3f}x)",
                "<= 0.05x",
                stall / saves[sync]["durable"] <= 0.05,
            ),
            (
                f"{digest}: async stall ÷ copy floor",
                f"{stall / r['copy_floor']:.2f}x",
                f"<= {floor_limit}x",
                stall / r["copy_floor"] <= floor_limit,
            ),
            (
                f"{digest}: async durable ÷ raw dcp.save ({'one device' if r['write_once'] else 'staged elsewhere'})",
                f"{durable:.2f}x",
                f"<= {durable_limit}x",
                durable <= durable_limit,
            ),
        ]
        if not tight:
            out.append(
                (
                    f"{digest}: sync within 10 % of what the cores allow",
                    f"{throughput / most:.2f} of it",
                    ">= 0.9",
                    throughput >= 0.9 * most,
                )
            )
        for mode, limit in (("cold", 1.1 if tight else 1.3), ("cached", 1.2 if tight else 1.3)):
            load = res[LOADS[sync]]
            ratio = load[mode] / raw_load[mode]
            bound = cpu_floor(load[f"{mode} cpu"], cores, raw_load[mode])
            out.append(
                (
                    f"{digest}: resume ÷ raw dcp.load ({mode})",
                    f"{ratio:.2f}x (cores' bound {bound:.2f}x)",
                    f"<= {limit}x",
                    ratio <= limit,
                )
            )
            if not tight:
                out.append(
                    (
                        f"{digest}: resume ({mode}) within 10 % of the cores' bound",
                        f"{ratio / bound:.2f}x of it",
                        "<= 1.1x",
                        ratio <= 1.1 * bound,
                    )
                )
    out.append(
        (
            "for reference: dcp.async_save blocking ÷ raw dcp.save blocking",
            f"{saves[ASYNC]['blocking'] / raw['blocking']:.3f}x",
            "",
            None,
        )
    )
    return out


def table(rows: Sequence[tuple[str, ...]]) -> None:
    """Left-aligned first and last columns, right-aligned numbers."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    last = len(widths) - 1
    for row in rows:
        cells = [
            c.ljust(w) if i in (0, last) else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        print("  ".join(cells).rstrip())


# ------------------------------------------------------------------------------------------------ main


def worker(args: argparse.Namespace) -> int:
    """Every measurement, on each rank; rank 0 prints the report (and writes --json)."""
    start, load_start = time.perf_counter(), os.getloadavg()[0]
    configure_logs(logging.WARNING)
    device, backend, where = CPU, "gloo", "cpu"
    if args.device == "cuda":  # FSDP's collectives on nccl; the CPU tensors of the bookkeeping on gloo
        device, backend = torch.device("cuda", int(os.environ["LOCAL_RANK"])), "cpu:gloo,cuda:nccl"
        torch.cuda.set_device(device)
        where = f"cuda ({torch.cuda.get_device_name(device)}, one per rank)"
    dist.init_process_group(backend)
    base: Path = args.dir
    rank, ranks = dist.get_rank(), dist.get_world_size()
    say(
        f"[setup] building the {args.model} model (FSDP2, {ranks} ranks on {where}) and taking one AdamW step"
    )
    shape = [f"--{k}={v}" for k, v in (("layers", args.layers), ("dim", args.dim)) if v is not None]
    methods = [m for m in METHODS if not (args.no_gathered and m == GATHERED)]
    bench = Bench(args.model, base, device, shape, methods, args.stage_dir or base / "stage")
    config = model_config(parse_args(["--ckpt-dir", str(base / "unused"), "--model", args.model, *shape]))
    say(f"        state {bench.state_bytes / GB:.3f} GB")
    try:
        for round_ in range(args.repeats + 1):
            say(f"[saves] round {round_}/{args.repeats}" + (" (warm-up)" if round_ == 0 else ""))
            last = round_ == args.repeats
            for method in bench.methods:
                if method == FT_ASYNC:  # the floor right before the stall it bounds: the same noise
                    bench.copy_floor(record=round_ > 0)
                bench.measure(method, record=round_ > 0, keep=last and method in (RAW, *LOADS))
        say("[resume]")
        resume = bench.resume(args.repeats)
    finally:
        bench.close()
    result: dict[str, Any] = {
        "machine": {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "cores": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "omp_threads": torch.get_num_threads(),
            "load_start": load_start,
            "load_end": os.getloadavg()[0],
        },
        "device": where,
        "ranks": ranks,
        "backend": "nccl + gloo" if args.device == "cuda" else backend,
        "model": args.model,
        "layers": config["layers"],
        "dim": config["dim"],
        "oversubscribed": args.device == "cpu" and ranks > (os.cpu_count() or 1),
        "params": bench.params,
        "state_bytes": bench.state_bytes,
        "rank_bytes_max": int(worst(bench.rank_bytes)),
        "repeats": args.repeats,
        "dir": str(base),
        "fs": fs_type(base),
        "same_device_as_repo": base.stat().st_dev == Path(__file__).stat().st_dev,
        "saves": {
            m: {
                "blocking": median(s.blocking),
                "durable": median(s.durable),
                "disk_bytes": median(s.disk_bytes),
                "extra": median(s.extra),
                "cpu": median(s.cpu),
                "all_blocking": s.blocking,
                "all_durable": s.durable,
            }
            for m, s in bench.samples.items()
        },
        "write_once": getattr(bench.async_.store, "write_once", False),  # the file store's choice
        "copy_floor": median(bench.floors),
        "copy_gbps": median(bench.copy_gbps),
        "all_copy_floor": bench.floors,
        "resume": {name: {mode: median(v) for mode, v in modes.items()} for name, modes in resume.items()},
        "resume_all": resume,
    }
    dist.destroy_process_group()
    if rank == 0:
        publish(result, start, args.json, report, targets)
    return 0


def publish(
    result: dict[str, Any],
    start: float,
    json_path: Path | None,
    report: Callable[[dict[str, Any]], None],
    targets: Callable[[dict[str, Any]], list[tuple[str, str, str, bool | None]]],
) -> None:
    """Rank 0's end of a run: the wall time, the printed report, and every figure with its target as JSON."""
    result["wall_s"] = time.perf_counter() - start
    report(result)
    if json_path:
        result["targets"] = [
            {"figure": f, "value": v, "target": t, "met": ok} for f, v, t, ok in targets(result)
        ]
        json_path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"figures written to {json_path}")


def launch(args: argparse.Namespace) -> int:
    """Run the workers under torchrun in a fresh directory (on the same disk as `--dir`), then remove it."""
    ranks = args.nproc if args.device == "cpu" else min(args.nproc, torch.cuda.device_count())
    if ranks == 0:
        print("bench_checkpoint: --device cuda: no CUDA device is visible", file=sys.stderr)
        return 2
    parent = args.dir or Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="ftrain-bench-ckpt-", dir=parent)).absolute()
    argv = [__file__, "--model", args.model, "--repeats", str(args.repeats), "--dir", str(base)]
    argv += ["--device", args.device, *(["--no-gathered"] if args.no_gathered else [])]
    stage = (
        None
        if args.stage_dir is None
        else Path(tempfile.mkdtemp(prefix="ftrain-bench-stage-", dir=args.stage_dir))
    )
    argv += [] if stage is None else ["--stage-dir", str(stage.absolute())]
    if args.state_gb is not None:
        args.layers, args.dim = sized(args.model, args.state_gb)
    argv += [f"--{k}={v}" for k, v in (("layers", args.layers), ("dim", args.dim)) if v is not None]
    if args.json:
        argv += ["--json", str(args.json.absolute())]
    env = os.environ | {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    try:
        return subprocess.run([*command, *argv], env=env, check=False).returncode
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
        if args.keep:
            print(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments; launch torchrun, or be one of its workers."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="85m", help="debug: a quick smoke run")
    parser.add_argument("--repeats", type=int, default=3, help="measured rounds (after one warm-up)")
    parser.add_argument("--dir", type=Path, help="where checkpoints go (a fresh subdirectory; default /tmp)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint directory")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where the state lives: cpu (2 gloo ranks), or cuda (one rank per GPU, at most 2)",
    )
    parser.add_argument(
        "--nproc", type=int, default=WORLD, help=f"ranks (default {WORLD}; on cuda at most one per GPU)"
    )
    parser.add_argument("--layers", type=int, help="override the model's layer count (as the trainer's)")
    parser.add_argument("--dim", type=int, help="override the model's width (as the trainer's)")
    parser.add_argument(
        "--state-gb", type=float, help="pick --layers and --dim for a model + AdamW state of about this size"
    )
    parser.add_argument(
        "--no-gathered",
        action="store_true",
        help="skip torch.save of the gathered state (rank 0 alone holds all of it: the slowest, largest)",
    )
    parser.add_argument(
        "--stage-dir",
        type=Path,
        help="where ftrain async stages (a fresh subdirectory; default beside the checkpoints, where it writes "
        "once; on another device, e.g. /dev/shm, it stages there and copies)",
    )
    parser.add_argument(
        "--storage",
        help="s3://BUCKET[/PREFIX]: benchmark S3 instead (scripts/bench_s3.py, on a throwaway SeaweedFS)",
    )
    args = parser.parse_args(argv)
    if args.storage is not None:
        import bench_s3

        rest = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--keep"]
        return bench_s3.main(rest)
    if args.repeats < 1 or args.nproc < 1:
        parser.error("--repeats and --nproc must be >= 1")
    if args.state_gb is not None and (args.layers is not None or args.dim is not None):
        parser.error("--state-gb picks --layers and --dim: give one or the other")
    if "LOCAL_RANK" in os.environ:
        return worker(args)
    return launch(args)


if __name__ == "__main__":
    run_then_exit(main)  # its torchrun workers end like the trainer: see ftrain.train.process_exit
