"""Cost curves: `scripts/bench_checkpoint.py` over state sizes × rank counts, beside the disk and memcpy limits.

Run: ``.venv/bin/python scripts/bench_scaling.py [--sizes 0.25,0.5,1,2] [--ranks 1,2,4] [--repeats 1]
[--budget-s 1200] [--dir DIR] [--json docs/scaling.json]``, then ``scripts/plot_scaling.py`` draws the JSON.

Each point of the grid is one ordinary ``bench_checkpoint.py`` run (``--state-gb``, ``--nproc``, ``--no-gathered``:
raw ``dcp.save``, ``dcp.async_save``, ftrain sync and async, resume cold and cached), so the curves are the same
figures as the single-size benchmark, only more of them. Around the grid, once before and once after, the same
process measures what no checkpoint can beat on this machine: an fsync'd sequential write of 1 GB and its cold
read back (the disk), and ``copy_`` between two preallocated 1 GB tensors (memcpy). The grid runs smallest size
first; a point is skipped, and the JSON says why, when its estimated memory exceeds what is available or when,
scaled from the last point with as many ranks, it would overrun ``--budget-s``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from bench_checkpoint import ASYNC, FT_ASYNC, FT_LOAD, FT_SYNC, GB, RAW, RAW_LOAD, evict, median, table
from bench_events import fs_type

HERE = Path(__file__).resolve().parent
LIMIT_BYTES = int(1 * GB)
CHUNK = 64 << 20
# peak host memory of one point, in state sizes: parameters, gradients and moments (4/3), ftrain's staging
# buffers and dcp.async_save's staging copy (1 each), the copy floor's source and destination (2), with slack
MEMORY_PER_STATE = 6.0
MEMORY_PER_RANK = 0.7 * GB  # an interpreter with torch loaded, the gloo buffers

# panel -> the (method, figure) pairs it draws, and which limit bounds them from below
PANELS: dict[str, tuple[tuple[tuple[str, str], ...], str]] = {
    "save, durable": (((RAW, "durable"), (FT_SYNC, "durable")), "disk_write"),
    "async save: training stall": (((ASYNC, "blocking"), (FT_ASYNC, "blocking")), "memcpy"),
    "async save: durable": (((ASYNC, "durable"), (FT_ASYNC, "durable")), "disk_write"),
    "resume, cold": (((RAW_LOAD, "cold"), (FT_LOAD, "cold")), "disk_read"),
    "resume, cached": (((RAW_LOAD, "cached"), (FT_LOAD, "cached")), "memcpy"),
}
LIMIT_NAMES = {
    "disk_write": "disk write (1 GB, fsync'd)",
    "disk_read": "disk read, cold",
    "memcpy": "memcpy (copy_)",
}


# ------------------------------------------------------------------------------------------------ limits


def disk_limits(where: Path) -> tuple[float, float]:
    """(write, cold read) GB/s of one 1 GB file on `where`'s disk: written in 64 MiB blocks and fsync'd, as
    a checkpoint's shards are; then its pages dropped and read back, as a cold resume reads them."""
    block = os.urandom(CHUNK)  # incompressible, in case the disk or file system compresses
    with tempfile.TemporaryDirectory(prefix="ftrain-disk-limit-", dir=where) as folder:
        path = Path(folder) / "block"
        start = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            for _ in range(LIMIT_BYTES // CHUNK):
                os.write(fd, block)
            os.fsync(fd)
        finally:
            os.close(fd)
        write = LIMIT_BYTES / (time.perf_counter() - start) / GB
        evict(Path(folder))
        buffer = bytearray(CHUNK)
        start = time.perf_counter()
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buffer):
                pass
        read = LIMIT_BYTES / (time.perf_counter() - start) / GB
    return write, read


def memcpy_limit(repeats: int = 5) -> float:
    """GB/s of `copy_` between two preallocated, already faulted-in 1 GB host tensors, with torch's default
    threads (one per core): the whole machine copying, the ceiling of every rank's staging copy together."""
    src = torch.ones(LIMIT_BYTES, dtype=torch.uint8)
    dst = torch.empty(LIMIT_BYTES, dtype=torch.uint8)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return LIMIT_BYTES / median(times) / GB


def limits(where: Path) -> dict[str, float]:
    """One measurement of each limit, GB/s."""
    write, read = disk_limits(where)
    return {"disk_write": write, "disk_read": read, "memcpy": memcpy_limit()}


# -------------------------------------------------------------------------------------------------- grid


def available_bytes() -> int:
    """MemAvailable from /proc/meminfo: what the points may use without pushing anything out to swap."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def why_skip(gb: float, ranks: int, done: Sequence[dict[str, Any]], left_s: float) -> str | None:
    """Why the point (gb, ranks) is not run, or None: too big for memory, or, scaled linearly in size from the
    largest point already run with as many ranks (the curves are close to linear), longer than the time left."""
    need, have = MEMORY_PER_STATE * gb * GB + MEMORY_PER_RANK * ranks, available_bytes()
    if need > 0.8 * have:
        return f"needs ~{need / GB:.1f} GB of memory, {have / GB:.1f} GB available"
    before = [p for p in done if p["ranks"] == ranks and p["rc"] == 0]
    if before:
        last = max(before, key=lambda p: p["target_gb"])
        expect = last["wall_s"] * gb / last["target_gb"]
        if expect > left_s:
            return f"would take ~{expect:.0f} s, {max(left_s, 0):.0f} s of --budget-s left"
    return None


def run_point(gb: float, ranks: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One bench_checkpoint.py run at this size and rank count; its figures as it wrote them."""
    command = [
        sys.executable,
        str(HERE / "bench_checkpoint.py"),
        "--state-gb",
        str(gb),
        "--nproc",
        str(ranks),
    ]
    command += ["--repeats", str(args.repeats), "--no-gathered", "--json", str(out)]
    if args.dir:
        command += ["--dir", str(args.dir)]
    print(f"\n=== {gb} GB × {ranks} ranks: {' '.join(command[1:])}", flush=True)
    start = time.perf_counter()
    rc = subprocess.run(command, check=False).returncode
    point: dict[str, Any] = {"target_gb": gb, "ranks": ranks, "rc": rc, "wall_s": time.perf_counter() - start}
    if rc == 0:
        point["result"] = json.loads(out.read_text())
    return point


# --------------------------------------------------------------------------------------------- the curves


def fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares line through the points: (seconds per GB, fixed seconds). One point: through the origin."""
    if len(xs) == 1:
        return ys[0] / xs[0], 0.0
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return slope, my - slope * mx


def figure(result: dict[str, Any], method: str, what: str) -> float:
    """Seconds of one method's figure in one point's results (a save's blocking/durable, a load's cold/cached)."""
    section = result["saves"] if method in result["saves"] else result["resume"]
    return float(section[method][what])


Curve = list[tuple[float, float, float]]  # (state GB as measured, seconds, the GB asked for), by size


def curves(grid: dict[str, Any]) -> dict[str, dict[str, dict[int, Curve]]]:
    """panel -> method -> ranks -> its curve."""
    out: dict[str, dict[str, dict[int, Curve]]] = {}
    for panel, (series, _) in PANELS.items():
        out[panel] = {}
        for method, what in series:
            lines: dict[int, Curve] = {}
            for point in grid["points"]:
                if point["rc"] == 0:
                    r = point["result"]
                    xy = (r["state_bytes"] / GB, figure(r, method, what), point["target_gb"])
                    lines.setdefault(point["ranks"], []).append(xy)
            out[panel][method] = {ranks: sorted(xy) for ranks, xy in sorted(lines.items())}
    return out


def label(method: str, what: str) -> str:
    """A series' name: the method, and which of its figures."""
    return f"{method}, {what}"


def report(grid: dict[str, Any]) -> None:
    """The limits, the fitted seconds per GB of every series beside them, each size's seconds, the skips."""
    lim = grid["limits"]
    print(f"\ncost curves, {grid['machine']['date']}; grid wall time {grid['wall_s']:.0f} s")
    rows: list[tuple[str, ...]] = [("limit", "before GB/s", "after GB/s", "s/GB (median)")]
    for key, name in LIMIT_NAMES.items():
        rows.append((name, f"{lim['before'][key]:.2f}", f"{lim['after'][key]:.2f}", f"{1 / lim[key]:.3f}"))
    table(rows)
    sizes = sorted({p["target_gb"] for p in grid["points"]})
    rows = [
        ("panel", "series", "ranks", "s/GB fit", "fixed s", *(f"{g} GB s" for g in sizes), "last step s/GB")
    ]
    for panel, methods in curves(grid).items():
        series = dict(PANELS[panel][0])
        for method, lines in methods.items():
            for ranks, curve in lines.items():
                xs, ys = [x for x, _, _ in curve], [y for _, y, _ in curve]
                slope, fixed = fit(xs, ys)
                by_size = {g: y for _, y, g in curve}
                step = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(curve) > 1 else float("nan")
                cells = [f"{by_size[g]:.3f}" if g in by_size else "-" for g in sizes]
                rows.append(
                    (
                        panel,
                        label(method, series[method]),
                        str(ranks),
                        f"{slope:.3f}",
                        f"{fixed:.3f}",
                        *cells,
                        f"{step:.3f}",
                    )
                )
    print()
    table(rows)
    for skip in grid["skipped"]:
        print(f"skipped {skip['target_gb']} GB × {skip['ranks']} ranks: {skip['why']}")


# ------------------------------------------------------------------------------------------------ main


def numbers(text: str, kind: type[float] | type[int]) -> list[Any]:
    """A comma-separated list."""
    return [kind(v) for v in text.split(",") if v]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", default="0.25,0.5,1,2", help="state sizes, GB (model + AdamW)")
    parser.add_argument(
        "--ranks", default="1,2,4", help="rank counts (CPU ranks beyond the cores oversubscribe)"
    )
    parser.add_argument("--repeats", type=int, default=1, help="measured rounds per point, after one warm-up")
    parser.add_argument("--budget-s", type=float, default=1200, help="wall time the grid may take")
    parser.add_argument("--dir", type=Path, help="where checkpoints go (default /tmp)")
    parser.add_argument("--json", type=Path, default=HERE.parent / "docs" / "scaling.json")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    where = args.dir or Path(tempfile.gettempdir())
    where.mkdir(parents=True, exist_ok=True)
    loads = [os.getloadavg()[0]]
    print("[limits] before the grid", flush=True)
    before = limits(where)
    points: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ftrain-scaling-") as scratch:
        for gb in sorted(numbers(args.sizes, float)):
            for ranks in sorted(numbers(args.ranks, int)):
                left = args.budget_s - (time.perf_counter() - start) - 60  # the limits again, after
                why = why_skip(gb, ranks, points, left)
                if why is not None:
                    print(f"\n=== {gb} GB × {ranks} ranks: skipped, {why}", flush=True)
                    skipped.append({"target_gb": gb, "ranks": ranks, "why": why})
                    continue
                points.append(run_point(gb, ranks, args, Path(scratch) / f"{gb}-{ranks}.json"))
                loads.append(os.getloadavg()[0])
    print("[limits] after the grid", flush=True)
    after = limits(where)
    grid: dict[str, Any] = {
        "machine": {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "cores": os.cpu_count(),
            "memory_gb": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GB,
            "platform": platform.platform(),
            "processor": platform.processor(),
            "torch": torch.__version__,
            "fs": fs_type(where.absolute()),
            "load_1min": loads,
        },
        "repeats": args.repeats,
        "limits": {"before": before, "after": after} | {k: median([before[k], after[k]]) for k in before},
        "points": points,
        "skipped": skipped,
        "failed": [
            {"target_gb": p["target_gb"], "ranks": p["ranks"], "rc": p["rc"]} for p in points if p["rc"]
        ],
        "wall_s": time.perf_counter() - start,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(grid, indent=1) + "\n")
    report(grid)
    print(f"figures written to {args.json}")
    return 1 if grid["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
