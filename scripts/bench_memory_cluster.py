"""Benchmark the memory tier on a cluster of network-namespace nodes, against durable storage behind a shaped
link, side by side in one run: what an unwarned failure costs (restart load seconds and steps trained again)
with and without the memory tier, what a snapshot stalls the loop for against the copy floor, and what the
replicas move between nodes.

Run (root): ``.venv/bin/python scripts/bench_memory_cluster.py [--model 85m] [--rounds 3] [--rate 800mbit]
[--every 10] [--memory-every 2] [--json out.json]``. It makes 3 nodes (``scripts/cluster.py``): an S3 server
(moto) on node 3 whose port is shaped to ``--rate`` each way with tc's htb (``800mbit``: 100 MB/s, a shared file
system or object store as a job at scale sees it), and one torchrun agent on each of nodes 1 and 2, 2 CPU ranks
each (gloo), every node with its own memory directory on a tmpfs. The ranks build the reference trainer's FSDP2
model (``85m``: model + AdamW ≈ 1 GB over the 4 ranks) and train it for real. Each round, one durable
interval:

1. a sync durable save to the shaped store at the interval's first step (what the loop waits for);
2. real training steps up to an unwarned kill drawn at random within the interval (the same draw on every
   rank, seeded by the round), a memory snapshot every ``--memory-every`` steps through ``MemoryTier.take``
   (the stall timed, the ``copy_`` of the rank's state bytes into a preallocated buffer, the copy floor, timed
   just before); at the kill, the steps lost: since the newest snapshot recorded by then (with the tier), since
   the durable save (without);
3. the restart's load, every rank at once, barrier to barrier: from each node's memory
   (``resume_from_memory``); from the peer (node 2's parts removed, as a node lost whole: its ranks get them
   back from the replicas node 1 holds, then load); from the shaped durable store (``CheckpointManager.load``);
4. replication bandwidth: every rank swaps a buffer the size of its part with its buddy on the next node (the
   tier's transport, ``replication.swap``), all at once.

The bytes that crossed the shaped link are counted, so the durable figures are known to have gone through it.
Figures are medians over the rounds (the first is not a warm-up: each round's load is a restart's).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

S3_PORT = 9000
RUN = "bench-memory-cluster"
RDZV_PORT = 29511


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="85m")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", default="800mbit", help="the durable store's link, in tc's units")
    parser.add_argument("--every", type=int, default=10, help="steps between durable saves")
    parser.add_argument("--memory-every", type=int, default=2, help="steps between memory snapshots")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--bucket", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not 1 <= args.memory_every < args.every - 1:
        print(
            "bench_memory_cluster: --memory-every must be at least 1 and below --every - 1", file=sys.stderr
        )
        return 2
    if args.worker is not None:
        return worker(args)
    from cluster import unavailable

    if why := unavailable():
        print(f"bench_memory_cluster: {why}", file=sys.stderr)
        return 2
    result = host(args)
    print_table(result)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


# -- the host: the cluster, the shaped store, the two agents -------------------------------------------------


def host(args: argparse.Namespace) -> dict[str, Any]:
    from cluster import Cluster

    from ftrain.workers.storage.s3.boto_client import make_client

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-memory-cluster-") as scratch:
        nodes = Cluster(Path(scratch), 3).up()
        try:
            url = nodes.start_s3("node3", S3_PORT)
            nodes.throttle("node3", args.rate, port=S3_PORT)
            bucket = "bench-memory"
            keys = {
                "AWS_ACCESS_KEY_ID": "bench",
                "AWS_SECRET_ACCESS_KEY": "bench",
                "AWS_DEFAULT_REGION": "us-east-1",
            }
            make_client(endpoint=url, access_key="bench", secret_key="bench").create_bucket(Bucket=bucket)
            out = Path(scratch) / "result.json"
            env = {**keys, "AWS_ENDPOINT_URL": url, "OMP_NUM_THREADS": "1",
                   "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
            passed = ["--model", args.model, "--rounds", str(args.rounds), "--every", str(args.every),
                      "--memory-every", str(args.memory_every), "--worker", str(out), "--bucket", bucket]  # fmt: skip
            pipes = {"stdout": subprocess.PIPE, "text": True}  # their stderr: this one's, to follow them
            agents = [
                nodes.popen(node, agent(nodes, n, passed), env, **pipes)
                for n, node in enumerate(("node1", "node2"))
            ]
            while not any(a.returncode not in (None, 0) for a in agents) and None in (
                a.poll() for a in agents
            ):
                time.sleep(1)  # a node that failed leaves the other waiting on it: `down` ends it
            outputs = [agent.communicate() if agent.returncode is not None else ("", "") for agent in agents]
            if failed := [a.returncode for a in agents if a.returncode != 0]:
                raise SystemExit(f"bench_memory_cluster: a node failed (rc {failed}), its output above")
            result: dict[str, Any] = json.loads(out.read_text())
            said = outputs[0][0]
            result["resumed lines"] = {tier: said.count(f", from {tier}") for tier in ("memory", "peer")}
            result["bytes over the shaped link"] = nodes.crossed("node3")
        finally:
            nodes.down()
    result.update(
        date=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        machine=f"{platform.node()} ({os.cpu_count()} cores, {platform.processor() or platform.machine()})",
        load_average={"before": load_before, "after": os.getloadavg()},
        command=" ".join([Path(sys.executable).name, *sys.argv]),
        rate=args.rate,
    )
    return result


def agent(nodes: Any, node_rank: int, passed: list[str]) -> list[str]:
    """argv of node `node_rank`'s torchrun agent: 2 ranks of this script, static rendezvous on node 1."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node_rank),
            "--nproc-per-node", "2", "--master-addr", nodes.address("node1"), "--master-port", str(RDZV_PORT),
            __file__, *passed]  # fmt: skip


# -- one rank ------------------------------------------------------------------------------------------------


def worker(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    bench = Rank(args)
    try:
        rounds = [bench.round(r) for r in range(1, args.rounds + 1)]
    finally:
        bench.close()
    every_rank: list[dict[str, list[float]]] = [{}] * bench.world
    dist.all_gather_object(every_rank, bench.samples)
    parts: list[list[int]] = [[]] * bench.world
    dist.all_gather_object(parts, [one["part bytes"] for one in rounds])
    if bench.rank == 0:
        figures = summarize(args, rounds, every_rank, parts, bench.state_bytes, bench.params, bench.world)
        args.worker.write_text(json.dumps(figures))
    dist.destroy_process_group()
    return 0


class Rank:
    """One rank's side: the reference trainer's state, a durable manager on the shaped store, the memory tier
    on its node's memory directory, and the per-snapshot samples."""

    def __init__(self, args: argparse.Namespace) -> None:
        import msgspec
        import torch
        import torch.distributed as dist
        from bench_checkpoint import build_state

        from ftrain import settings
        from ftrain.events.schema import Snapshotted
        from ftrain.train.checkpointing import CheckpointManager
        from ftrain.train.config import CheckpointConfig
        from ftrain.train.snapshots import MemoryTier
        from ftrain.workers.memory_tier import memory_root
        from ftrain.workers.staging import local_bytes
        from ftrain.workers.storage.location import run_location

        self.args, self.rank, self.world = args, dist.get_rank(), dist.get_world_size()
        home = Path(
            tempfile.mkdtemp(prefix=f"rank-{self.rank}-", dir=os.environ.get("FTRAIN_HOME"))
        )  # node-local
        self.state, self.params = build_state(args.model, home)
        self.state_bytes = local_bytes(self.state.state_dict())
        location = run_location(f"s3://{args.bucket}/bench/{RUN}")
        config = CheckpointConfig(location=location, stage_dir=home / "stage", keep=2)
        self.durable = CheckpointManager.from_config(config, self.state)
        assert self.durable.load() == 0
        self.root = memory_root(settings.memory_dir(os.environ), RUN)
        memory = msgspec.structs.replace(
            config, run_id=RUN, memory_every=args.memory_every, memory_root=self.root
        )
        self.recorded: list[Snapshotted] = []
        self.tier = MemoryTier(memory, self.manifest_of, self.recorded.append)
        self.tier.ready()
        self.source = torch.empty(self.state_bytes, dtype=torch.uint8)
        self.floor = torch.empty(self.state_bytes, dtype=torch.uint8)
        self.samples: dict[str, list[float]] = {"copy floor": [], "snapshot stall": [], "train step": []}

    def manifest_of(self, step: int, epoch: int, files: list[Any]) -> Any:
        from ftrain.workers.manifest import Manifest

        return Manifest(run_id=RUN, step=step, epoch=epoch, shards=self.world, world_size=self.world,
                        dataset_revision=None, created_at=datetime.now(UTC),
                        files=tuple(sorted(files, key=lambda e: e.name)))  # fmt: skip

    def train_step(self) -> None:
        from ftrain.examples.data import ResumableLoader

        model, optimizer, loader = self.state.model, self.state.optimizer, self.state.states["loader"]
        assert model is not None and optimizer is not None and isinstance(loader, ResumableLoader)
        inputs, targets, _ = loader.next()
        model(inputs, targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def round(self, r: int) -> dict[str, Any]:
        """Durable save, training to the kill drawn for round `r`, then the restart's loads (see the module)."""
        import torch.distributed as dist

        from ftrain.domain.lifecycle import SnapshotRef
        from ftrain.train.memory_resume import resume_from_memory
        from ftrain.train.replication import swap
        from ftrain.workers.memory_tier import rank_dir

        every, memory_every = self.args.every, self.args.memory_every
        start = r * every
        self.state.step = start
        one: dict[str, Any] = {"durable save (sync)": together(partial(self.durable.save, start))}
        kill = random.Random(r).randint(start + memory_every + 1, start + every - 1)
        for step in range(start + 1, kill + 1):
            self.samples["train step"].append(timed(self.train_step))
            if self.rank == 0:
                print(f"step {step}: {self.samples['train step'][-1]:.2f} s", file=sys.stderr, flush=True)
            self.state.step = step
            if self.tier.due(step):
                self.samples["copy floor"].append(timed(partial(self.floor.copy_, self.source)))
                take = partial(self.tier.take, step, 0, self.state.state_dict, attempt=1)
                self.samples["snapshot stall"].append(timed(take))
        newest = self.tier.newest  # what a kill now finds recorded (a real kill loses the one in flight)
        self.tier.wait()
        assert self.recorded and self.recorded[-1].step == self.tier.newest
        candidate = SnapshotRef(recorded=self.recorded[-1])
        part = rank_dir(self.root, candidate.recorded.step, self.rank)
        size = sum(f.stat().st_size for f in part.rglob("*") if f.is_file())
        resume = partial(resume_from_memory, self.tier, candidate, self.state, None, 1, RUN)
        one.update(kill=kill, durable=start, snapshot=newest, lost_without=kill - start,
                   lost_with=kill - (newest if newest is not None and newest > start else start),
                   load_memory=together(resume))  # fmt: skip
        buddy, source = self.tier.buddy, self.tier.source
        assert buddy is not None and source is not None
        sizes: list[int] = [0] * self.world
        dist.all_gather_object(sizes, size)  # a rank's part differs from its source's by a few bytes
        one["replication"] = together(
            partial(swap, self.tier.group, buddy, bytes(size), source, sizes[source])
        )
        one["part bytes"] = size
        if self.rank >= self.tier.local_world:  # node 2's parts gone, as with the node
            shutil.rmtree(part)
        one["load_peer"] = together(resume)
        one["load_durable"] = together(self.durable.load)
        if self.rank == 0:
            print(f"round {r}: {one}", file=sys.stderr, flush=True)
        return one

    def close(self) -> None:
        self.tier.close(completed=True)
        self.durable.close()


def together(action: Callable[[], object]) -> float:
    """Every rank runs `action` at once: barrier to barrier, so the slowest rank counts."""
    import torch.distributed as dist

    dist.barrier()
    start = time.perf_counter()
    action()
    dist.barrier()
    return time.perf_counter() - start


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def summarize(
    args: argparse.Namespace,
    rounds: list[dict[str, Any]],
    every_rank: list[dict[str, list[float]]],
    parts: list[list[int]],
    state_bytes: int,
    params: int,
    world: int,
) -> dict[str, Any]:
    """Rank 0: the figures. A snapshot's stall and floor are the slowest rank's (the loop waits for it)."""
    median = statistics.median
    stalls = [
        max(r["snapshot stall"][i] for r in every_rank) for i in range(len(every_rank[0]["snapshot stall"]))
    ]
    floors = [max(r["copy floor"][i] for r in every_rank) for i in range(len(every_rank[0]["copy floor"]))]
    moved = [
        sum(p[i] for p in parts) for i in range(len(rounds))
    ]  # every rank's part crosses to another node
    loads = {name: [r[f"load_{name}"] for r in rounds] for name in ("memory", "peer", "durable")}
    step = median(s for r in every_rank for s in r["train step"])
    cost = {
        "with": [r["lost_with"] * step + r["load_memory"] for r in rounds],
        "without": [r["lost_without"] * step + r["load_durable"] for r in rounds],
    }
    return {
        "model": args.model,
        "params": params,
        "state_bytes_per_rank": state_bytes,
        "world": world,
        "rounds": args.rounds,
        "every": args.every,
        "memory_every": args.memory_every,
        "train_step_seconds": step,
        "per_round": rounds,
        "median_seconds": {f"load from {name}": median(v) for name, v in loads.items()}
        | {
            "sync durable save": median(r["durable save (sync)"] for r in rounds),
            "snapshot stall": median(stalls),
            "copy floor": median(floors),
            "replication": median(r["replication"] for r in rounds),
        },
        "spread_seconds": {f"load from {name}": [min(v), max(v)] for name, v in loads.items()},
        "lost_steps": {
            "with the tier": [r["lost_with"] for r in rounds],
            "without": [r["lost_without"] for r in rounds],
        },
        "failure_cost_seconds": {k: median(v) for k, v in cost.items()},
        "ratios": {
            "load from durable / load from memory": median(loads["durable"]) / median(loads["memory"]),
            "load from durable / load from peer": median(loads["durable"]) / median(loads["peer"]),
            "snapshot stall / copy floor": median(s / f for s, f in zip(stalls, floors, strict=True)),
        },
        "replication_GB_per_s": median(m / r["replication"] for m, r in zip(moved, rounds, strict=True))
        / 1e9,
    }


def print_table(result: dict[str, Any]) -> None:
    gb = result["state_bytes_per_rank"] * result["world"] / 1e9
    print(f"{result['date']} {result['machine']}, load average {result['load_average']['before'][0]:.1f} before, "
          f"{result['load_average']['after'][0]:.1f} after")  # fmt: skip
    print(f"{result['command']}")
    print(f"model {result['model']} ({result['params'] / 1e6:.0f}M params, {gb:.2f} GB of state over "
          f"{result['world']} ranks on 2 nodes), durable store behind {result['rate']}, every {result['every']}, "
          f"memory_every {result['memory_every']}, {result['rounds']} rounds (medians; train step "
          f"{result['train_step_seconds']:.2f} s)")  # fmt: skip
    for name, seconds in result["median_seconds"].items():
        spread = result["spread_seconds"].get(name)
        extra = f"   [{spread[0]:.2f}–{spread[1]:.2f}]" if spread else ""
        print(f"  {name:<26} {seconds:8.3f} s{extra}")
    for name, ratio in result["ratios"].items():
        print(f"  {name:<40} {ratio:6.2f}x")
    lost = result["lost_steps"]
    print(f"  lost steps per failure: with the tier {lost['with the tier']}, without {lost['without']}")
    cost = result["failure_cost_seconds"]
    print(
        f"  failure cost (steps again + load): with the tier {cost['with']:.1f} s, without {cost['without']:.1f} s"
    )
    print(f"  replication {result['replication_GB_per_s']:.2f} GB/s; resumed lines {result['resumed lines']}; "
          f"{result['bytes over the shaped link'] / 1e9:.2f} GB over the shaped link")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
