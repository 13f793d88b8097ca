"""Goodput of a run preempted three times, with and without save-on-signal, measured side by side in one run.

    python scripts/bench_preemption.py                  # 80 steps, preempted at steps 15, 35, 55
    python scripts/bench_preemption.py --iters 120 --at 25,55,85 --save-interval 30 --step-delay 0.3

Each mode is one run of the reference trainer (2 CPU processes, gloo) under `ftrain run`, on a throwaway NATS
server: three times, once rank 0 reached the given step, the supervisor gets SIGTERM (what a scheduler's
preemption or `scancel --full --signal=TERM` sends it) and the run is relaunched (`ftrain run --run-id`, as a
requeued job's is); the fourth attempt completes. "save on signal": the default (the relay hands the workers
SIGUSR1, they save at the next step and exit 83); "no save": FTRAIN_SAVE_SIGNALS=none (SIGTERM kills the workers;
the steps since the last periodic checkpoint are trained again). Printed per mode: goodput (`ftrain cost --run`),
lost steps, and for each preemption the wall time from the signal to the supervisor's exit and from the relaunch
to the first step trained again.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ftrain.events.jetstream.nats_server import throwaway_server

FTRAIN = str(Path(sys.executable).with_name("ftrain"))


def rank0(ckpt: Path) -> list[dict[str, Any]]:
    path = ckpt / "metrics" / "metrics-0.jsonl"
    lines = path.read_bytes().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.endswith(b"}")]


def one_mode(name: str, env: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    """One run preempted at each of `args.at`, then completed; what it measured."""
    run = f"bench-{name}"
    ckpt = Path(env["FTRAIN_STORAGE"]) / run
    argv = [FTRAIN, "run", "bench", "--nodes", "1", "--gpus-per-node", "2", "--run-id", run, "--max-retries", "0",
            "--", "-m", "ftrain.examples.train", "--train-iters", str(args.iters),
            "--save-interval", str(args.save_interval)]  # fmt: skip
    stops: list[dict[str, float]] = []
    starts: list[float] = []
    for at in [*args.at, None]:
        starts.append(time.time())
        job = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if at is None:
            _, err = job.communicate(timeout=900)
            if job.returncode != 0:
                raise SystemExit(f"{name}: the last attempt failed ({job.returncode}): {err[-2000:]}")
            break
        while max((m.get("train/iter", 0) for m in rank0(ckpt)), default=0) < at:
            if job.poll() is not None:
                raise SystemExit(f"{name}: the job ended before step {at}: {job.communicate()[1][-2000:]}")
            time.sleep(0.05)
        signalled = time.time()
        job.send_signal(signal.SIGTERM)
        job.communicate(timeout=120)
        stops.append({"signal_to_exit": time.time() - signalled})
    steps = [m for m in rank0(ckpt) if "train/loss" in m]
    for stop, relaunched in zip(stops, starts[1:], strict=True):  # from each relaunch's own clock
        before = [m["train/iter"] for m in steps if m["time"] < relaunched]
        after = next(m for m in steps if m["time"] >= relaunched)
        stop["relaunch_to_step"] = after["time"] - relaunched
        stop["lost"] = max(before) - (after["train/iter"] - 1)
    cost = subprocess.run([FTRAIN, "cost", "--run", run, "--json"], env=env, capture_output=True, text=True,
                          check=True)  # fmt: skip
    goodput = json.loads(cost.stdout.splitlines()[-1])["goodput"]
    print(f"{name}: {json.dumps({'goodput': goodput, 'stops': stops})}", flush=True)
    return {"goodput": goodput, "stops": stops}


def seconds(term: str) -> Callable[[dict[str, Any]], str]:
    """A table cell: one goodput term of a mode's run (`unknown` where the log cannot tell)."""

    def cell(result: dict[str, Any]) -> str:
        value = result["goodput"][f"{term}_seconds"]
        return "unknown" if value is None else f"{value:.1f}"

    return cell


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=80)
    parser.add_argument("--at", type=lambda t: [int(x) for x in t.split(",")], default=[15, 35, 55])
    parser.add_argument("--save-interval", type=int, default=20)
    parser.add_argument(
        "--step-delay", type=float, default=0.25, help="seconds each step sleeps (a slower job)"
    )
    args = parser.parse_args()
    results = {}
    with (
        tempfile.TemporaryDirectory(prefix="bench-preemption-") as tmp,
        throwaway_server(Path(tmp)) as server,
    ):
        base = {**os.environ, "FTRAIN_HOME": f"{tmp}/home", "FTRAIN_STORAGE": f"{tmp}/ckpt",
                "FTRAIN_NATS_URL": server.url, "FTRAIN_NATS_NKEY": server.nkey_file, "OMP_NUM_THREADS": "1",
                "FTRAIN_STEP_DELAY": str(args.step_delay)}  # fmt: skip
        for name, extra in (("save-on-signal", {}), ("no-save", {"FTRAIN_SAVE_SIGNALS": "none"})):
            results[name] = one_mode(name, {**base, **extra}, args)
    print(
        f"\n{args.iters} steps, preempted (SIGTERM to ftrain run) at steps {args.at}, periodic save every "
        f"{args.save_interval}, {args.step_delay} s/step delay"
    )
    print(f"{'':28}" + "".join(f"{name:>22}" for name in results))
    rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("goodput", lambda r: f"{r['goodput']['ratio'] * 100:.1f} %"),
        *[
            (f"{term} (s)", seconds(term))
            for term in ("wall", "productive", "checkpoint_stall", "startup", "restart", "down", "recomputed")
        ],
        ("lost steps per preemption", lambda r: " ".join(str(int(s["lost"])) for s in r["stops"])),
        ("signal → exit (s)", lambda r: " ".join(f"{s['signal_to_exit']:.1f}" for s in r["stops"])),
        ("relaunch → first step (s)", lambda r: " ".join(f"{s['relaunch_to_step']:.1f}" for s in r["stops"])),
    ]
    for label, cell in rows:
        print(f"{label:28}" + "".join(f"{cell(r):>22}" for r in results.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
