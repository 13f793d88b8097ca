"""Smoke test of the S3 checkpoint benchmark (`scripts/bench_s3.py`): at the debug size it starts its own
SeaweedFS, runs every method it knows on two CPU ranks (ftrain's streamed and local-file saves with each digest
among them), and writes figures for each of them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT


@pytest.mark.timeout(120)
def test_bench_s3_runs_at_debug_size(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "bench_checkpoint.py"),
            "--storage",
            "s3://smoke/ckpt",
            "--model",
            "debug",
            "--repeats",
            "1",
            "--dir",
            str(tmp_path),
            "--json",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(out.read_text())
    saves, resume = figures["saves"], figures["resume"]
    ftrain_saves = [
        f"ftrain S3 sync, {way}{digest}" for way in ("streamed", "local file") for digest in ("", ", blake3")
    ]
    assert {*ftrain_saves, "raw boto3 (dcp.save + upload)"} <= set(saves)
    loads = {
        "ftrain load() (download + verify + load)",
        "ftrain load(), blake3",
        "raw boto3 download + dcp.load",
    }
    assert loads <= set(resume)
    for s in [*saves.values(), *resume.values()]:
        assert len(s["all"]) == 1
        assert s["seconds"] > 0
    assert all(s["stored_bytes"] > 0 for s in saves.values())
    assert figures["targets"]
    assert list(tmp_path.iterdir()) == [out]  # the store and the work directories are gone
