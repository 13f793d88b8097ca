"""Benchmark a Prometheus scrape of `ftrain metrics` over many runs, on a throwaway nats-server.

Run: ``.venv/bin/python scripts/bench_metrics.py [--runs 1000]``.

Writes `--runs` runs of 8 events each, as a trainer under `ftrain run` records them (launched; three
checkpoints with their measured stall and training time; a preemption; a resume; two checkpoints that report
the steps lost), 16 runs at a time, then starts `ftrain metrics` and times GET /metrics with the token: the
first scrape (the read model caught up from nothing, every run's events walked) and the next ones (caught up
already: the walk of the log and the rendering), with the bytes each sends.
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import msgspec

from ftrain.events.chain import ChainHead
from ftrain.events.jetstream.nats_server import throwaway_server
from ftrain.events.schema import AnyEvent, Checkpointed, Failed, Launched, Resumed, now
from ftrain.service import RunService

WRITERS = 16


def run_events(run_id: str) -> list[AnyEvent]:
    """One run's eight events over 47 s ending now (each with an id: append keeps its time)."""
    start = now() - timedelta(seconds=47)

    def save(step: int, attempt: int, **measured: float) -> Checkpointed:
        return Checkpointed(run_id=run_id, step=step, epoch=0, shards=8, uri=f"file:///c/{run_id}/step-{step}",
                            checkpoint_hash=f"{step:064x}", size_bytes=1 << 30, attempt=attempt, **measured)  # fmt: skip

    launched = Launched(run_id=run_id, project=f"p{int(run_id[-1]) % 10}", strategy="fsdp", nodes=2, gpus_per_node=8,
                        hosts=("n1", "n2"), allocation_source="slurm", rdzv_endpoint="n1:29500",
                        command=("train.py",), storage="file:///c")  # fmt: skip
    third = save(300, 1, stall_seconds=1.0, train_seconds=18.0, loop_seconds=21.0)
    resumed = Resumed(run_id=run_id, checkpoint_seq=4, step=300, epoch=0, uri=third.uri, resume_count=1, attempt=2,
                      checkpoint_hash=third.checkpoint_hash)  # fmt: skip
    timed: list[tuple[float, AnyEvent]] = [
        (0, launched),
        (11, save(100, 1, stall_seconds=1.0, train_seconds=6.0, loop_seconds=7.0)),
        (18, save(200, 1, stall_seconds=1.0, train_seconds=12.0, loop_seconds=14.0)),
        (25, third),
        (27, Failed(run_id=run_id, reason="preempted", attempt=1)),
        (30, resumed),
        (40, save(400, 2, stall_seconds=1.0, train_seconds=6.0, loop_seconds=7.0, lost_steps=20)),
        (47, save(500, 2, stall_seconds=1.0, train_seconds=12.0, loop_seconds=14.0)),
    ]
    return [
        msgspec.structs.replace(e, time=start + timedelta(seconds=t), id=uuid.uuid4().hex) for t, e in timed
    ]


async def write_runs(env: dict[str, str], runs: int) -> float:
    """Append every run's events (WRITERS runs at once); the seconds it took."""
    started = time.perf_counter()
    queue = [f"bench-{i:05d}" for i in range(runs)]
    async with RunService.open(env) as app:

        async def writer() -> None:
            while queue:
                head = ChainHead()
                for event in run_events(queue.pop()):
                    head = (await app.store.append(event, head)).head

        await asyncio.gather(*(writer() for _ in range(WRITERS)))
    return time.perf_counter() - started


def scrape(url: str, token: str) -> tuple[float, int]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        body = response.read()
    return time.perf_counter() - started, len(body)


def bench(runs: int, scrapes: int, tmp: Path) -> dict[str, object]:
    with throwaway_server(tmp / "server") as server:
        env = {"FTRAIN_HOME": str(tmp / "home"), "FTRAIN_NATS_URL": server.url,
               "FTRAIN_NATS_NKEY": server.nkey_file, "FTRAIN_STORAGE": str(tmp / "ckpt")}  # fmt: skip
        print(f"writing {runs} runs x 8 events", flush=True)
        wrote = asyncio.run(write_runs(env, runs))
        script = Path(sys.executable).with_name("ftrain")
        proc = subprocess.Popen([str(script), "metrics", "--listen", "127.0.0.1:0", "--json"],
                                env={**os.environ, **env}, stdout=subprocess.PIPE, text=True)  # fmt: skip
        try:
            assert proc.stdout is not None
            serving = json.loads(proc.stdout.readline())
            token = Path(serving["token_file"]).read_text().strip()
            first, size = scrape(serving["url"], token)
            warm = [scrape(serving["url"], token) for _ in range(scrapes)]
        finally:
            proc.terminate()
            proc.wait(30)
    times = sorted(t for t, _ in warm)
    return {"runs": runs, "events": runs * 8, "write_s": round(wrote, 2), "first_scrape_s": round(first, 3),
            "scrape_median_s": round(statistics.median(times), 3), "scrape_max_s": round(times[-1], 3),
            "bytes": size, "bytes_warm": warm[-1][1]}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000, help="runs in the log (default 1000)")
    parser.add_argument("--scrapes", type=int, default=5, help="scrapes timed after the first (default 5)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ftrain-bench-metrics-") as tmp:
        result = bench(args.runs, args.scrapes, Path(tmp))
    print(json.dumps(result))
    print(f"{result['runs']} runs ({result['events']} events): first scrape {result['first_scrape_s']} s, then "
          f"median {result['scrape_median_s']} s (max {result['scrape_max_s']} s), {result['bytes']:,} bytes")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
