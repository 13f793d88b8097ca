"""Benchmark `ftrain export` against `torch.distributed.checkpoint.format_utils.dcp_to_torch_save`, side by side.

Run: ``.venv/bin/python scripts/bench_export.py [--model 85m] [--repeats 3] [--dir DIR]``. It makes a private
ftrain home with its own embedded log, launches a run, builds the reference model (``85m``: model + AdamW state
≈ 1 GB), takes one AdamW step and saves it through ``CheckpointManager`` (one process, recorded in the log), then
measures, interleaved per round after one warm-up round, each method in a fresh process (so each one's peak RSS
is its own):

1. ``dcp_to_torch_save``: the whole checkpoint (model + optimizer) into one ``torch.save`` file, unverified;
2. ``ftrain export --format torch --with-optimizer``: the same contents (model.pt + optimizer.pt), verified;
3. ``ftrain export`` (safetensors): the model's weights only, streamed a batch of tensors at a time.

Seconds are the call's own (the log read, the verification of every file, the load and the write, fsync'd),
not the interpreter's start or `import torch`; throughput is the checkpoint's bytes over those seconds; peak
RSS is the process's peak above what it held right before the call, against the bytes the method writes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RUN = "bench-export"
METHODS = {
    "dcp_to_torch_save": [],
    "ftrain export --format torch --with-optimizer": ["--format", "torch", "--with-optimizer"],
    "ftrain export (safetensors)": [],
}
BASELINE = "dcp_to_torch_save"


def _status(field: str) -> int:
    """A byte count of /proc/self/status (`VmRSS`: resident now; `VmHWM`: the peak since the last reset)."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(f"{field}:"))
    return int(line.split()[1]) * 1024


def _reset_peak() -> None:
    """Start the peak over from what is resident now (Linux ≥ 4.0). `ru_maxrss` cannot be used: a forked
    child starts with its parent's peak, here the benchmark's own model."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def child(method: str, ckpt: Path, out: Path) -> None:
    """One measurement in this fresh process: one JSON line on stdout."""
    import torch  # noqa: F401  (imported before the baseline, as every method needs it)
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from ftrain.cli.main import main

    _reset_peak()
    before = _status("VmRSS")
    start = time.perf_counter()
    if method == BASELINE:
        out.mkdir(mode=0o700)
        dcp_to_torch_save(ckpt, out / "checkpoint.pt")
        fd = os.open(out / "checkpoint.pt", os.O_RDONLY)
        os.fsync(fd)  # ftrain's files are fsync'd: the same work
        os.close(fd)
    else:
        code = main(["export", RUN, "--to", str(out), *METHODS[method], "--json"])
        assert code == 0, code
    seconds = time.perf_counter() - start
    peak = _status("VmHWM")
    written = sum(p.stat().st_size for p in out.iterdir())
    print(json.dumps({"seconds": seconds, "peak_above": max(0, peak - before), "written": written}))


def _train(model_name: str, location: Path) -> int:
    """The reference model after one AdamW step, saved at step 1 on the logged run; its parameter bytes."""
    import torch

    from ftrain.examples.model import MODELS, TinyGPT
    from ftrain.train.checkpointing import CheckpointManager

    config = MODELS[model_name]
    model = TinyGPT(**{k: config[k] for k in ("vocab", "dim", "layers", "heads", "seq")})
    model.init_weights(0, 0)
    optimizer = torch.optim.AdamW(model.parameters())
    tokens = torch.randint(0, config["vocab"], (config["batch"], config["seq"] + 1))
    model(tokens[:, :-1], tokens[:, 1:]).backward()
    optimizer.step()
    ckpt = CheckpointManager(str(location), model=model, optimizer=optimizer, run_id=RUN, every=1)
    try:
        ckpt.load()
        ckpt.save(1)
    finally:
        ckpt.close()
    return sum(p.numel() * p.element_size() for p in model.parameters())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model", default="85m", help="a model of ftrain.examples.model.MODELS (debug: smoke)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--dir", type=Path, help="where the checkpoint and the exports go (default: a temp dir)"
    )
    parser.add_argument("--child", nargs=3, metavar=("METHOD", "CKPT", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]), Path(args.child[2]))
        return 0
    base = Path(tempfile.mkdtemp(prefix="bench-export-", dir=args.dir))
    env = {**os.environ, "FTRAIN_HOME": str(base / "home"), "FTRAIN_STORAGE": str(base / "ckpt")}
    env.pop("FTRAIN_NATS_URL", None)
    os.environ.update(env)
    from ftrain.cli.main import main as ftrain

    try:
        assert ftrain(["launch", "bench", "--nodes", "1", "--run-id", RUN]) == 0
        params = _train(args.model, base / "ckpt" / RUN)
        ckpt = base / "ckpt" / RUN / "step-1"
        ckpt_bytes = sum(p.stat().st_size for p in ckpt.iterdir())
        samples: dict[str, list[dict[str, Any]]] = {m: [] for m in METHODS}
        for round_ in range(args.repeats + 1):
            for method in METHODS:
                out = base / f"out-{round_}-{len(samples[method])}"
                done = subprocess.run(
                    [sys.executable, __file__, "--child", method, str(ckpt), str(out)],
                    env=env, capture_output=True, text=True, check=True,
                )  # fmt: skip
                if round_:  # the first round warms the page cache and the imports
                    samples[method].append(json.loads(done.stdout.strip().splitlines()[-1]))
                shutil.rmtree(out)
        _report(args.model, params, ckpt_bytes, samples)
    finally:
        ftrain(["server", "stop"])
        shutil.rmtree(base, ignore_errors=True)
    return 0


def _report(model: str, params: int, ckpt_bytes: int, samples: dict[str, list[dict[str, Any]]]) -> None:
    base = statistics.median(s["seconds"] for s in samples[BASELINE])
    print(f"{datetime.now(UTC):%Y-%m-%d}, {os.cpu_count()} CPUs, model {model}: parameters {params / 1e9:.3f} GB, "
          f"checkpoint {ckpt_bytes / 1e9:.3f} GB (median of {len(samples[BASELINE])} rounds, page cache warm)")  # fmt: skip
    print(
        f"{'method':48} {'seconds':>8} {'ckpt GB/s':>10} {'written GB':>11} {'peak RSS GB':>12} {'speed vs baseline':>18}"
    )
    for method, runs in samples.items():
        seconds = statistics.median(s["seconds"] for s in runs)
        peak = statistics.median(s["peak_above"] for s in runs)
        written = runs[0]["written"]
        print(f"{method:48} {seconds:8.2f} {ckpt_bytes / seconds / 1e9:10.2f} {written / 1e9:11.3f} "
              f"{peak / 1e9:12.3f} {base / seconds:17.2f}x")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
