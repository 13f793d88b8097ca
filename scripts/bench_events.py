"""Benchmark ftrain's event path against raw JetStream, on a throwaway nats-server (``sync_interval: always``).

Run: ``.venv/bin/python scripts/bench_events.py [--events N] [--json out.json]``.

Measures in one run, side by side:

1. sequential appends on one run: raw acked ``js.publish`` (no headers) vs ``EventStore.append`` (hash chain,
   compare-and-set, ``Nats-Msg-Id``), interleaved in alternating blocks;
2. the same from 8 runs at once (8 tasks on one connection);
3. projection catch-up of a fresh SQLite read model over the whole stream, beside the raw read-back rate and
   its bound: the same read and chain walk writing nothing;
4. ``audit verify`` (``RunService.verify``) over the same stream, beside the raw read-back rate;
5. wall time of a ``ftrain status RUN`` process, beside the interpreter-start floor;
6. the trainer's start-up query (``read_run``: one run's own events, folded) on a stream holding only that
   run, and again once the stream holds the mixed-lifecycle events of every other run: it must not grow.

Every event it writes, raw or not, is a legal, correctly chained event, so the projector must accept all of
them; the script checks that it did. The mixed-lifecycle events for 3-4 are sealed here and published pipelined
with exactly the headers EventStore.append sends, so the stream reads back as one written by ftrain.
Other load on the machine shows up in every figure: 1 and 2 interleave raw and ftrain blocks so it hits both
alike; 3 and 4 report medians of several passes.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib.metadata
import json
import logging
import math
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
from nats.js import JetStreamContext

from ftrain.domain.chain_walk import ChainWalk
from ftrain.domain.lifecycle import RunState, apply, corrupt_skipped_event, resumed_event
from ftrain.events.anchor_file import AnchorFiles
from ftrain.events.chain import ChainHead, SignHash, seal
from ftrain.events.jetstream.connection import NatsSettings, anchor_files
from ftrain.events.jetstream.nats_client import Nats
from ftrain.events.jetstream.nats_server import nats_server_binary, throwaway_server
from ftrain.events.jetstream.store import EventStore
from ftrain.events.keyring import load_signer, load_trust
from ftrain.events.log_port import EventLog
from ftrain.events.record import run_subject
from ftrain.events.schema import (
    Actor,
    AnyEvent,
    Checkpointed,
    CheckpointPolicy,
    Completed,
    Failed,
    Launched,
    encode_event,
    now,
)
from ftrain.events.signed_log import process_actor
from ftrain.logs import configure as configure_logs
from ftrain.projections.projector import CATCH_UP_BATCH
from ftrain.service import RunService
from ftrain.train.resume import read_run

CONCURRENT_RUNS = 8
SEQ_BLOCKS = 10
CONC_BLOCKS = 4
WARMUP = 50
READ_REPEATS = 3

# ---------------------------------------------------------------------------------------------- events


class Sealed(NamedTuple):
    """A sealed payload ready to publish, its subject, and the id EventStore.append sends as Nats-Msg-Id."""

    subject: str
    payload: bytes
    msg_id: str


class ChainBuilder:
    """One run's legal event sequence: unstamped templates, or payloads sealed as EventStore.append would."""

    def __init__(self, run_id: str, rng: random.Random, actor: Actor, sign: SignHash) -> None:
        self.run_id = run_id
        self.rng = rng
        self.actor = actor
        self.sign = sign
        self.state: RunState | None = None  # only tracked for chains this builder seals itself
        self.step = 0
        nodes = rng.choice((1, 2, 4, 8, 16))
        self.nodes, self.gpus = nodes, rng.choice((4, 8))

    # -- templates (what a caller hands to EventStore.append) --------------------------------------------

    def launched(self) -> Launched:
        """A realistic `launched`: hosts, a torchrun command line, storage and a checkpoint policy."""
        hosts = tuple(f"node{i:03d}" for i in range(1, self.nodes + 1))
        command = (
            "torchrun",
            f"--nnodes={self.nodes}",
            f"--nproc-per-node={self.gpus}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={hosts[0]}:29500",
            f"--rdzv-id={self.run_id}",
            "--max-restarts=0",
            "train.py",
            "--config",
            "configs/llm-7b.yaml",
            "--strategy",
            "fsdp",
        )
        return Launched(
            run_id=self.run_id,
            project="JPCP",
            strategy="fsdp",
            nodes=self.nodes,
            gpus_per_node=self.gpus,
            hosts=hosts,
            allocation_source="slurm",
            rdzv_endpoint=f"{hosts[0]}:29500",
            command=command,
            storage="file:///shared/ftrain/checkpoints",
            dataset_revision="A1-rev-42",
            checkpoint_policy=CheckpointPolicy(text="10min", seconds=600.0),
        )

    def checkpointed(self) -> Checkpointed:
        """The next checkpoint, at a strictly higher step."""
        self.step += self.rng.randint(100, 1000)
        return Checkpointed(
            run_id=self.run_id,
            step=self.step,
            epoch=self.step // 5000,
            shards=self.nodes * self.gpus,
            uri=f"file:///shared/ftrain/checkpoints/{self.run_id}/step-{self.step:09d}",
            checkpoint_hash=hashlib.sha256(f"{self.run_id}/{self.step}".encode()).hexdigest(),
            size_bytes=self.rng.randint(10**9, 5 * 10**10),
        )

    # -- sealed chains (built here, published raw) -----------------------------------------------------------

    def seal_next(self, event: AnyEvent) -> Sealed:
        """Stamp and seal `event` as the next link (as EventStore.append does) and fold it (must be legal)."""
        head = self.state.head if self.state is not None else ChainHead()
        stamped = msgspec.structs.replace(
            event, seq=head.seq + 1, prev_hash=head.hash, id=uuid.uuid4().hex, time=now(), actor=self.actor
        )
        payload, digest = seal(encode_event(stamped), head.hash, self.sign)
        self.state = apply(self.state, stamped, ChainHead(stamped.seq, digest, 0))
        return Sealed(run_subject(self.run_id, str(stamped.__struct_config__.tag)), payload, stamped.id)

    def next_mixed(self) -> AnyEvent:
        """A realistic next event: mostly checkpoints, sometimes a failure, then corrupt skips and a resume."""
        state = self.state
        if state is None:
            return self.launched()
        valid = state.valid_checkpoints()
        if state.status == "running":
            if len(valid) >= 2 and self.rng.random() < 0.04:
                reason = self.rng.choice(("preempted", "preempted", "node-failure", "oom", "exit-code"))
                return Failed(
                    run_id=self.run_id, reason=reason, exit_code=None if reason == "preempted" else 1
                )
            return self.checkpointed()
        newest = valid[0]  # failed runs here always keep ≥ 1 valid checkpoint
        if len(valid) >= 2 and self.rng.random() < 0.25:
            return corrupt_skipped_event(state, newest, "manifest digest mismatch: shard 3 of 8 altered")
        return resumed_event(state, newest, forced=False)

    def completed(self) -> Completed:
        """Completion with wall-time cost (only legal while running)."""
        assert self.state is not None
        seconds = self.state.running_seconds_at(now())
        return Completed(
            run_id=self.run_id,
            cost_gpu_hours=seconds * self.nodes * self.gpus / 3600,
            running_seconds=seconds,
            cost_source="wall-time",
        )

    def sealed_mixed(self, count: int, complete: bool) -> list[Sealed]:
        """`count` sealed events of a mixed lifecycle, ending in `completed` when asked and still running."""
        out = [self.seal_next(self.next_mixed()) for _ in range(count - 1)]
        assert self.state is not None
        last = self.completed() if complete and self.state.status == "running" else self.next_mixed()
        out.append(self.seal_next(last))
        return out

    def sealed_checkpoints(self, count: int) -> list[Sealed]:
        """`launched` then `count` checkpoints, sealed (the raw publisher's payloads)."""
        return [self.seal_next(self.launched())] + [self.seal_next(self.checkpointed()) for _ in range(count)]


# ----------------------------------------------------------------------------------------------- stats


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    if not sorted_values:
        return math.nan
    return sorted_values[max(0, min(len(sorted_values) - 1, math.ceil(p / 100 * len(sorted_values)) - 1))]


@dataclass
class Series:
    """Latencies (s) of one kind of operation, and the wall time its blocks took."""

    latencies: list[float] = field(default_factory=list)
    wall: float = 0.0

    def summary(self) -> dict[str, float]:
        """p50/p90/p99/mean in ms and events/s over the blocks' wall time."""
        lat = sorted(self.latencies)
        return {
            "count": len(lat),
            "p50_ms": percentile(lat, 50) * 1e3,
            "p90_ms": percentile(lat, 90) * 1e3,
            "p99_ms": percentile(lat, 99) * 1e3,
            "mean_ms": statistics.fmean(lat) * 1e3 if lat else math.nan,
            "events_per_s": len(lat) / self.wall if self.wall else math.nan,
        }


# ---------------------------------------------------------------------------------- 1. sequential appends


async def bench_sequential(
    js: JetStreamContext, store: EventStore, unsigned: EventStore, n: int, rng: random.Random, sign: SignHash
) -> dict[str, Any]:
    """Raw acked publish vs EventStore.append signed and anchored (`store`, the product) vs unsigned and
    unanchored (`unsigned`: the append before signing), one run each, in rotating blocks of n / SEQ_BLOCKS."""
    per_block = max(1, n // SEQ_BLOCKS)
    raw_builder = ChainBuilder("bench-seq-raw", rng, store.actor, sign)
    raw_chain = raw_builder.sealed_checkpoints(WARMUP + per_block * SEQ_BLOCKS)
    raw_iter = iter(raw_chain)

    async def raw_op() -> float:
        sealed = next(raw_iter)
        t0 = time.perf_counter()
        await js.publish(sealed.subject, sealed.payload)
        return time.perf_counter() - t0

    sizes: list[int] = []

    heads: dict[str, ChainHead] = {}
    builders: dict[str, ChainBuilder] = {}

    async def appender(target: EventStore, run_id: str) -> Callable[[], Awaitable[float]]:
        builder = builders[run_id] = ChainBuilder(run_id, rng, store.actor, sign)
        head = (await target.append(builder.launched(), ChainHead())).head

        async def op() -> float:
            nonlocal head
            event = builder.checkpointed()
            t0 = time.perf_counter()
            appended = await target.append(event, head)
            elapsed = time.perf_counter() - t0
            head = heads[run_id] = appended.head
            if target is store and len(sizes) < 100:
                sizes.append(len(seal(encode_event(appended.event), appended.event.prev_hash, sign)[0]))
            return elapsed

        return op

    signed_op = await appender(store, "bench-seq-ftrain")
    unsigned_op = await appender(unsigned, "bench-seq-unsigned")
    await raw_op()  # the raw run's `launched`
    for _ in range(WARMUP):
        for op in (raw_op, signed_op, unsigned_op):
            await op()

    series = {"raw": Series(), "ftrain": Series(), "unsigned": Series()}
    ops = {"raw": raw_op, "ftrain": signed_op, "unsigned": unsigned_op}
    names = list(ops)
    for block in range(SEQ_BLOCKS):
        for name in names[block % 3 :] + names[: block % 3]:  # rotate who goes first
            start = time.perf_counter()
            for _ in range(per_block):
                series[name].latencies.append(await ops[name]())
            series[name].wall += time.perf_counter() - start
    # a trusted writer's signed append vouches for the unsigned run's events before it, as after an upgrade
    await store.append(builders["bench-seq-unsigned"].checkpointed(), heads["bench-seq-unsigned"])
    raw_sizes = [len(s.payload) for s in raw_chain[1:101]]
    return {
        **{name: s.summary() for name, s in series.items()},
        "payload_bytes_raw": statistics.fmean(raw_sizes),
        "payload_bytes_ftrain": statistics.fmean(sizes),
    }


# ---------------------------------------------------------------------------------- 2. concurrent appends


async def bench_concurrent(
    js: JetStreamContext, store: EventStore, n: int, rng: random.Random, sign: SignHash
) -> dict[str, Any]:
    """CONCURRENT_RUNS tasks on one connection, each appending to its own run, raw vs ftrain, alternating."""
    per_task = max(1, n // (CONCURRENT_RUNS * CONC_BLOCKS))
    warm = 10
    raw_chains = [
        iter(
            ChainBuilder(f"bench-conc-raw-{i}", rng, store.actor, sign).sealed_checkpoints(
                warm + per_task * CONC_BLOCKS
            )
        )
        for i in range(CONCURRENT_RUNS)
    ]
    ft_builders = [
        ChainBuilder(f"bench-conc-ftrain-{i}", rng, store.actor, sign) for i in range(CONCURRENT_RUNS)
    ]
    heads = [(await store.append(b.launched(), ChainHead())).head for b in ft_builders]
    for chain in raw_chains:
        sealed = next(chain)  # each raw run's `launched`
        await js.publish(sealed.subject, sealed.payload)

    async def raw_op(i: int) -> float:
        sealed = next(raw_chains[i])
        t0 = time.perf_counter()
        await js.publish(sealed.subject, sealed.payload)
        return time.perf_counter() - t0

    async def ftrain_op(i: int) -> float:
        event = ft_builders[i].checkpointed()
        t0 = time.perf_counter()
        appended = await store.append(event, heads[i])
        elapsed = time.perf_counter() - t0
        heads[i] = appended.head
        return elapsed

    async def block(op: Callable[[int], Awaitable[float]], count: int, series: Series | None) -> None:
        async def worker(i: int) -> None:
            for _ in range(count):
                elapsed = await op(i)
                if series is not None:
                    series.latencies.append(elapsed)

        start = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(CONCURRENT_RUNS)))
        if series is not None:
            series.wall += time.perf_counter() - start

    await block(raw_op, warm, None)
    await block(ftrain_op, warm, None)
    raw, ftrain = Series(), Series()
    for b in range(CONC_BLOCKS):
        order = ((raw_op, raw), (ftrain_op, ftrain)) if b % 2 == 0 else ((ftrain_op, ftrain), (raw_op, raw))
        for op, series in order:
            await block(op, per_task, series)
    return {"raw": raw.summary(), "ftrain": ftrain.summary(), "tasks": CONCURRENT_RUNS}


# ------------------------------------------------------------------------------------------ population


async def populate(
    js: JetStreamContext, store: EventStore, events: int, rng: random.Random, sign: SignHash
) -> dict[str, Any]:
    """`events` sealed, legal events over many runs (mixed lifecycles), interleaved, published pipelined.

    Each carries exactly the headers EventStore.append sends (Nats-Msg-Id and the compare-and-set pair,
    with the true expected per-run sequence), so the stored messages, and their read-back cost, are those of
    a log written by ftrain, and the server checks every compare-and-set.
    """
    runs: list[list[Sealed]] = []
    total = 0
    t_gen = time.perf_counter()
    while total < events:
        length = max(3, min(rng.randint(20, 180), events - total))
        builder = ChainBuilder(f"dist-JPCP-{len(runs):04d}-8x8-fsdp", rng, store.actor, sign)
        runs.append(builder.sealed_mixed(length, complete=rng.random() < 0.3))
        total += length
    # Random interleave across runs (each run's own order kept), as many trainers writing at once would.
    cursors = [0] * len(runs)
    active = list(range(len(runs)))
    order: list[Sealed] = []
    while active:
        k = rng.randrange(len(active))
        r = active[k]
        order.append(runs[r][cursors[r]])
        cursors[r] += 1
        if cursors[r] == len(runs[r]):
            active[k] = active[-1]
            active.pop()
    next_seq = await store.last_seq() + 1
    last_of_run: dict[str, int] = {}
    headers: list[dict[str, str]] = []
    for i, sealed in enumerate(order):
        run_id = sealed.subject.split(".")[2]
        headers.append(
            {
                "Nats-Msg-Id": sealed.msg_id,
                "Nats-Expected-Last-Subject-Sequence": str(last_of_run.get(run_id, 0)),
                "Nats-Expected-Last-Subject-Sequence-Subject": run_subject(run_id),
            }
        )
        last_of_run[run_id] = next_seq + i
    gen_s = time.perf_counter() - t_gen

    start = time.perf_counter()
    futures = [
        await js.publish_async(sealed.subject, sealed.payload, headers=hdrs)
        for sealed, hdrs in zip(order, headers, strict=True)
    ]
    acks = await asyncio.gather(*futures)
    pub_s = time.perf_counter() - start
    if [a.seq for a in acks] != list(range(next_seq, next_seq + len(order))):
        raise SystemExit("pipelined publishes were not stored in order")
    types: dict[str, int] = {}
    for sealed in order:
        kind = sealed.subject.rsplit(".", 1)[1]
        types[kind] = types.get(kind, 0) + 1
    return {
        "events": len(order),
        "runs": len(runs),
        "by_type": types,
        "generate_s": gen_s,
        "publish_async_events_per_s": len(order) / pub_s,
        "first_run": runs[0][0].subject.split(".")[2],
    }


# ------------------------------------------------------------------------------ 6. the trainer's query


async def probe_run(store: EventStore, rng: random.Random, sign: SignHash) -> str:
    """A run of three events (launched, two checkpoints), appended before anything else fills the stream."""
    builder = ChainBuilder("trainer-probe", rng, store.actor, sign)
    head = ChainHead()
    for event in (builder.launched(), builder.checkpointed(), builder.checkpointed()):
        head = (await store.append(event, head)).head
    return builder.run_id


async def time_trainer_query(settings: NatsSettings, run_id: str, repeats: int = 7) -> float:
    """Median wall time of the trainer's start-up query (`read_run`, connection included)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        state = await asyncio.to_thread(read_run, run_id, settings, 30.0)
        times.append(time.perf_counter() - start)
        if state is None or len(state.checkpoints) != 2:
            raise SystemExit(f"the trainer's query read {state!r}")
    return statistics.median(times)


# ------------------------------------------------------------------------------ 3/4. projection & verify


async def raw_read(store: EventLog) -> tuple[int, float]:
    """Records read back via EventStore.read alone (no decode, no fold) and the seconds it took."""
    count = 0
    start = time.perf_counter()
    async for records in store.read(1):
        count += len(records)
    return count, time.perf_counter() - start


async def walk_read(store: EventLog) -> tuple[int, float]:
    """Read the stream from sequence 1 and walk every record through the chain check and the fold, writing
    nothing: the catch-up's work without its commit, so the most a catch-up could reach here."""
    walk, count = ChainWalk(), 0
    start = time.perf_counter()
    async for records in store.read(1, batch=CATCH_UP_BATCH):
        for record in records:
            walk.feed(record)
        count += len(records)
    seconds = time.perf_counter() - start
    if walk.findings or walk.strays:
        raise SystemExit(f"the chain walk refused records: {[*walk.findings.values(), *walk.strays][:3]}")
    return count, seconds


async def bench_readback(env: dict[str, str], expected_runs: int) -> dict[str, Any]:
    """Projection catch-up (fresh model, then twice after a reset), the read and chain walk alone, and audit
    verify, beside raw reads."""
    async with RunService.open(env) as app:
        last = await app.store.last_seq()
        reads: list[float] = []

        async def read_once() -> None:
            count, seconds = await raw_read(app.store)
            assert count == last, f"read back {count} records, stream has {last}"
            reads.append(count / seconds)

        await read_once()  # also warms the server's block cache
        projections: list[float] = []
        busy: list[float] = []  # CPU-s of this process (every thread) per wall second of each pass
        for attempt in range(READ_REPEATS):
            if attempt:
                await app.model.rebuild(app.projector.stream_id, (await app.model.position()).generation)
            start, cpu = time.perf_counter(), time.process_time()
            applied = await app.projector.catch_up()
            seconds = time.perf_counter() - start
            busy.append((time.process_time() - cpu) / seconds)
            assert applied == last, f"projector applied {applied} of {last}"
            projections.append(applied / seconds)
        dump = await app.model.dump()
        statuses: dict[str, int] = {}
        for row in dump["audit"]:
            statuses[row[8]] = statuses.get(row[8], 0) + 1
        if statuses != {"ok": last} or dump["broken_runs"] or len(dump["runs"]) != expected_runs:
            raise SystemExit(
                f"projection did not accept everything: audit statuses {statuses} (expected ok={last}), "
                f"{len(dump['broken_runs'])} broken run(s) {dump['broken_runs'][:3]}, "
                f"{len(dump['runs'])} runs (expected {expected_runs})"
            )
        walks: list[float] = []
        for _ in range(READ_REPEATS):
            count, seconds = await walk_read(app.store)
            assert count == last, f"walked {count} records, stream has {last}"
            walks.append(count / seconds)
        await read_once()
        verifies: list[float] = []
        for _ in range(READ_REPEATS):
            start = time.perf_counter()
            report = await app.verify()
            seconds = time.perf_counter() - start
            if not report.ok or report.events != last:
                raise SystemExit(f"audit verify failed: {report.events} events, {report.findings[:3]}")
            verifies.append(report.events / seconds)
        await read_once()
    return {
        "stream_events": last,
        "runs": len(dump["runs"]),
        "audit_ok_rows": statuses.get("ok", 0),
        "projection_events_per_s": statistics.median(projections),
        "projection_fresh_events_per_s": projections[0],
        "projection_all": projections,
        "projection_cores_busy": statistics.median(busy),
        "walk_events_per_s": statistics.median(walks),
        "walk_all": walks,
        "verify_events_per_s": statistics.median(verifies),
        "verify_all": verifies,
        "raw_read_events_per_s": statistics.median(reads),
        "raw_read_all": reads,
    }


# ----------------------------------------------------------------------------------------- 5. processes


def time_process(argv: list[str], env: dict[str, str], repeats: int) -> tuple[float, list[float]]:
    """Median wall time (s) of running `argv` to completion, after one untimed run; fails on non-zero exit."""
    samples: list[float] = []
    for i in range(repeats + 1):
        start = time.perf_counter()
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
        elapsed = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-500:]}")
        if i:
            samples.append(elapsed)
    return statistics.median(samples), samples


def bench_processes(env: dict[str, str], run_id: str, repeats: int = 5) -> dict[str, Any]:
    """`ftrain status RUN` against the caught-up read model, beside `python -c pass` and the import cost. With
    bytecode caches, as a user has them: PYTHONDONTWRITEBYTECODE (set in some shells and CI images) would have
    every run compile its modules again, about 0.08 s of the figure here; the untimed first run writes them."""
    full_env = {
        k: v for k, v in os.environ.items() if not k.startswith("FTRAIN_") and k != "PYTHONDONTWRITEBYTECODE"
    } | env
    script = str(Path(sys.executable).with_name("ftrain"))
    status, status_all = time_process([script, "status", run_id], full_env, repeats)
    floor, floor_all = time_process([sys.executable, "-c", "pass"], full_env, repeats)
    imports, imports_all = time_process(
        # what `ftrain status` loads, as it loads it (structlog without rich: `ftrain.cli.main`)
        [
            sys.executable,
            "-c",
            "from ftrain.cli.main import _light_imports as s; s(); "
            "import ftrain.cli.commands, ftrain.cli.queries, ftrain.service",
        ],
        full_env,
        repeats,
    )
    return {
        "status_s": status,
        "status_all": status_all,
        "python_floor_s": floor,
        "python_floor_all": floor_all,
        "import_s": imports,
        "import_all": imports_all,
        "run_id": run_id,
    }


# ---------------------------------------------------------------------------------------------- report


def machine() -> dict[str, Any]:
    """Cores, CPU, Python, nats-py, nats-server, date."""
    version = subprocess.run(
        [str(nats_server_binary()), "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "nats_py": importlib.metadata.version("nats-py"),
        "nats_server": version,
        "platform": platform.platform(),
    }


def fs_type(path: Path) -> str:
    """The filesystem type holding `path`, from /proc/mounts (longest mount-point prefix)."""
    best, kind = "", "?"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and str(path).startswith(parts[1]) and len(parts[1]) > len(best):
                best, kind = parts[1], parts[2]
    except OSError:
        pass
    return kind


COLUMNS = ("figure", "baseline", "ftrain", "ratio", "target", "")


def rows(r: dict[str, Any]) -> list[tuple[str, ...]]:
    """(figure, baseline, ftrain, ratio, target, verdict) rows of the table.

    The baseline is raw JetStream (raw publish, or EventStore.read alone), or `python -c pass` for processes;
    ratio is ftrain / baseline for latencies and times, baseline / ftrain for rates (so > 1 is ftrain's cost).
    """
    out: list[tuple[str, ...]] = []

    def row(
        name: str,
        base: float,
        ours: float,
        fmt: str,
        ratio: float | None,
        target: str = "",
        ok: bool | None = None,
    ) -> None:
        verdict = "" if ok is None else ("PASS" if ok else "MISS")
        shown = "" if ratio is None else f"{ratio:.2f}x"
        out.append((name, format(base, fmt), format(ours, fmt), shown, target, verdict))

    raw, ft = r["sequential"]["raw"], r["sequential"]["ftrain"]
    unsigned = r["sequential"]["unsigned"]
    p50 = ft["p50_ms"] / raw["p50_ms"]
    row("1 sequential append p50 ms", raw["p50_ms"], ft["p50_ms"], ".3f", p50, "ratio <= 1.5", p50 <= 1.5)
    signed = ft["p50_ms"] / unsigned["p50_ms"]
    row(
        "1 signed+anchored vs unsigned append p50 ms",
        unsigned["p50_ms"],
        ft["p50_ms"],
        ".3f",
        signed,
        "ratio <= 1.2",
        signed <= 1.2,
    )
    for key in ("p90_ms", "p99_ms"):
        row(f"1 sequential append {key[:3]} ms", raw[key], ft[key], ".3f", ft[key] / raw[key])
    rate = raw["events_per_s"] / ft["events_per_s"]
    row("1 sequential append ev/s", raw["events_per_s"], ft["events_per_s"], ",.0f", rate)
    conc = r["concurrent"]
    raw, ft = conc["raw"], conc["ftrain"]
    p50 = ft["p50_ms"] / raw["p50_ms"]
    row(
        f"2 {conc['tasks']} runs at once: p50 ms",
        raw["p50_ms"],
        ft["p50_ms"],
        ".3f",
        p50,
        "ratio <= 1.5 (as 1)",
        p50 <= 1.5,
    )
    row(
        f"2 {conc['tasks']} runs at once: p99 ms",
        raw["p99_ms"],
        ft["p99_ms"],
        ".3f",
        ft["p99_ms"] / raw["p99_ms"],
    )
    rate = raw["events_per_s"] / ft["events_per_s"]
    row(
        f"2 {conc['tasks']} runs at once: aggregate ev/s",
        raw["events_per_s"],
        ft["events_per_s"],
        ",.0f",
        rate,
    )
    rb = r["readback"]
    read, proj, ver = rb["raw_read_events_per_s"], rb["projection_events_per_s"], rb["verify_events_per_s"]
    row("3 projection catch-up ev/s (vs read)", read, proj, ",.0f", read / proj, ">= 40,000", proj >= 40_000)
    cores = r["machine"]["cores"]
    row("3   cores it kept busy (CPU-s a s, every thread)", cores, rb["projection_cores_busy"], ".2f", None)
    walk = rb["walk_events_per_s"]
    row("3   its bound: the read and chain walk alone ev/s", read, walk, ",.0f", read / walk)
    row("4 audit verify ev/s (vs read)", read, ver, ",.0f", read / ver, ">= 50,000", ver >= 50_000)
    pr = r["processes"]
    status = pr["status_s"]
    row(
        "5 `ftrain status RUN` s (vs python -c pass)",
        pr["python_floor_s"],
        status,
        ".3f",
        status / pr["python_floor_s"],
        "< 0.3",
        status < 0.3,
    )
    row("5   of which imports (python -c 'import ...')", pr["python_floor_s"], pr["import_s"], ".3f", None)
    tq = r["trainer_query"]
    total = r["population"]["events"]
    row(
        f"6 trainer start-up query s (alone vs among {total:,})",
        tq["alone_s"],
        tq["among_s"],
        ".4f",
        tq["among_s"] / tq["alone_s"],
        "< 0.02 s among",
        tq["among_s"] < 0.02,
    )
    catch_up_s = total / proj
    row("6   vs a fresh read model's catch-up (the old start-up)", catch_up_s, tq["among_s"], ".4f", None)
    return out


def print_report(r: dict[str, Any]) -> None:
    """Machine and workload lines, then the table."""
    m = r["machine"]
    print(f"\nftrain event benchmark, {m['date']}")
    print(f"machine: {m['cores']} cores ({m['cpu']}), {m['platform']}")
    print(
        f"         Python {m['python']}, nats-py {m['nats_py']}, {m['nats_server']}, "
        f"store on {r['store_fs']}, sync_interval: always"
    )
    seq, conc, pop, rb = r["sequential"], r["concurrent"], r["population"], r["readback"]
    print(
        f"1: {seq['raw']['count']} raw + {seq['ftrain']['count']} signed + {seq['unsigned']['count']} unsigned "
        f"appends, {SEQ_BLOCKS} rotating blocks, "
        f"payload {seq['payload_bytes_raw']:.0f} B raw / {seq['payload_bytes_ftrain']:.0f} B ftrain"
    )
    print(
        f"2: {conc['raw']['count']} raw + {conc['ftrain']['count']} ftrain appends, {conc['tasks']} tasks on one connection"
    )
    mix = ", ".join(f"{k} {v:,}" for k, v in sorted(pop["by_type"].items()))
    print(
        f"3-4: stream of {rb['stream_events']:,} events in {rb['runs']} runs, all {rb['audit_ok_rows']:,} projected "
        f"'ok'; rates are medians of {READ_REPEATS}; {pop['events']:,} mixed events: {mix}"
    )
    table = rows(r)
    widths = [max(len(t[i]) for t in (COLUMNS, *table)) for i in range(len(COLUMNS))]
    for t in (COLUMNS, *table):
        cells = [
            c.ljust(w) if i in (0, 4) else c.rjust(w) for i, (c, w) in enumerate(zip(t, widths, strict=True))
        ]
        print("  ".join(cells).rstrip())
    print(f"wall time {r['wall_s']:.1f} s")


# ------------------------------------------------------------------------------------------------ main


async def bench(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Every section against one throwaway server under `tmp`."""
    rng = random.Random(args.seed)
    result: dict[str, Any] = {"machine": machine(), "store_fs": fs_type(tmp)}
    with throwaway_server(tmp / "server") as server:
        env = {
            "FTRAIN_HOME": str(tmp / "home"),
            "FTRAIN_NATS_URL": server.url,
            "FTRAIN_NATS_NKEY": server.nkey_file,
            "FTRAIN_STORAGE": str(tmp / "ckpt"),
        }
        settings = NatsSettings(home=tmp / "home", url=server.url, nkey=server.nkey_file)
        actor = process_actor()
        signer = load_signer(settings.home, f"{actor.user}@{actor.host}")
        sign = signer.sign_hash
        nc = Nats()
        await nc.connect(server.url, nkeys_seed=server.nkey_file)
        try:
            trust = load_trust(settings.home)
            anchors = AnchorFiles(anchor_files(settings), signer, trust)
            store = EventStore(nc, actor=actor, signer=signer, anchors=anchors, trust=trust)
            unsigned = EventStore(nc, actor=actor)
            await store.ensure_stream()
            js = nc.jetstream(timeout=2.0)
            print(f"[1/5] sequential appends: {args.events} raw + {args.events} ftrain ×2", flush=True)
            result["sequential"] = await bench_sequential(js, store, unsigned, args.events, rng, sign)
            print(
                f"[2/5] {CONCURRENT_RUNS} concurrent runs: {args.events} raw + {args.events} ftrain",
                flush=True,
            )
            result["concurrent"] = await bench_concurrent(js, store, args.events, rng, sign)
            probe = await probe_run(store, rng, sign)
            result["trainer_query"] = {"alone_s": await time_trainer_query(settings, probe)}
            print(f"      populating {args.mixed_events:,} mixed-lifecycle events", flush=True)
            result["population"] = await populate(js, store, args.mixed_events, rng, sign)
            result["trainer_query"]["among_s"] = await time_trainer_query(settings, probe)
        finally:
            await nc.close()
        expected_runs = 4 + 2 * CONCURRENT_RUNS + result["population"]["runs"]
        print("[3/5 4/5] projection catch-up, audit verify, raw read-back", flush=True)
        result["readback"] = await bench_readback(env, expected_runs)
        print("[5/5] `ftrain status` processes", flush=True)
        result["processes"] = bench_processes(env, result["population"]["first_run"])
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run the benchmark in a temp dir, print the table, write --json."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=4000, help="appends per kind in sections 1 and 2")
    parser.add_argument(
        "--mixed-events", type=int, default=24_000, help="mixed-lifecycle events added for sections 3-4"
    )
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (store, read model)")
    args = parser.parse_args(argv)
    if args.events < SEQ_BLOCKS * CONCURRENT_RUNS or args.mixed_events < 3:
        parser.error(f"--events must be >= {SEQ_BLOCKS * CONCURRENT_RUNS} and --mixed-events >= 3")
    configure_logs(logging.WARNING)
    tmp = Path(tempfile.mkdtemp(prefix="ftrain-bench-"))
    start = time.perf_counter()
    try:
        result = asyncio.run(bench(args, tmp))
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    result["wall_s"] = time.perf_counter() - start
    result["params"] = {"events": args.events, "mixed_events": args.mixed_events, "seed": args.seed}
    result["table"] = [dict(zip((*COLUMNS[:-1], "verdict"), t, strict=True)) for t in rows(result)]
    print_report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
