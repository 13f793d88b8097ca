"""Resume from S3 on a real SeaweedFS: under real 2-rank torchrun jobs the data files (format 3, chunk digests)
are read chunk by chunk from the store by the load, never downloaded; only `.metadata` goes through rank 0's
node cache, and with a work directory per rank (two nodes) the other node's file is read from the store as
well, not fetched whole; the state loads bit-identical and nothing is left behind (the chunked load's
failures: tests/integration/test_s3_chunked_resume.py; the download path's fetch hook, for formats 1 and 2:
tests/integration/test_s3_resume.py)."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import free_port
from tests.support.s3 import Endpoint
from tests.support.training import torchrun_env

pytestmark = pytest.mark.timeout(300)
DOWNLOADED = {0: [".metadata"], 1: []}
"""What each rank downloads of the files it owns: its shards are read chunk by chunk by the load."""


def job(weed: Endpoint, work: Path, layout: str) -> tuple[str, list[dict[str, Any]]]:
    """Save then load under a 2-rank torchrun (`tests/support/s3_resume_job.py`); its stdout and its log events."""
    bucket = weed.new_bucket()
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "-m", "tests.support.s3_resume_job",
        "--object-dir", f"s3://{bucket}/ckpt/run", "--work", str(work), "--layout", layout,
    ]  # fmt: skip
    done = subprocess.run(
        command, env=torchrun_env(weed.env()), capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-3000:]}"
    events = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    return done.stdout, events


def loaded_as_saved(out: str) -> bool:
    line = next(line for line in out.splitlines() if line.startswith("SAVED "))
    _, saved, _, loaded, _, step = line.split()
    return saved == loaded and step == "7"


def leftovers(work: Path) -> list[str]:
    """What a save and a resume left in a node's work directory, but rank 0's progress file (lost work)."""
    return sorted(p.name for p in work.iterdir() if not p.name.startswith("progress-"))


def named(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == name]


def test_only_the_metadata_goes_through_the_nodes_cache(weed: Endpoint, tmp_path: Path) -> None:
    out, events = job(weed, tmp_path, "shared")
    assert loaded_as_saved(out), out
    downloaded = {e["rank"]: e["files"] for e in named(events, "resume_downloaded")}
    assert downloaded == DOWNLOADED
    assert named(events, "fetched_for_load") == [], "the load read every shard from the store"
    assert leftovers(tmp_path / "node") == [], "the cache is removed after"


def test_with_a_work_directory_per_rank_the_other_nodes_file_is_read_from_the_store(
    weed: Endpoint, tmp_path: Path
) -> None:
    out, events = job(weed, tmp_path, "per-rank")
    assert loaded_as_saved(out), out
    assert {e["rank"]: e["files"] for e in named(events, "resume_downloaded")} == DOWNLOADED
    # DCP keeps replicated items once, in one rank's file: the other rank reads those chunks from the store
    assert named(events, "fetched_for_load") == []
    assert [leftovers(tmp_path / f"node-{r}") for r in (0, 1)] == [[], []]
