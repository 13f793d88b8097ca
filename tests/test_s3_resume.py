"""Resume from S3 on a real SeaweedFS: under real 2-rank torchrun jobs each rank downloads only the files it
owns into its node's cache, and with a work directory per rank (two nodes) a file a rank's load needs that its
node lacks is fetched for the load; the state loads bit-identical and nothing is left behind. The fetch hook
itself, against the store: a damaged file is refused before a byte is parsed, a store out of reach stops,
and a failed DCP load means the same on every rank."""

import json
import os
import subprocess
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from torch.distributed.checkpoint.api import CheckpointException

from ftrain.train.resume_load import ResumeFailed, ResumeStopped, load_failure
from ftrain.workers.dcp_reader import Rejected
from ftrain.workers.storage.errors import StorageUnavailable
from ftrain.workers.storage.s3_run import FetchForLoad
from ftrain.workers.unpickle import ForbiddenPickle
from tests.conftest import free_port
from tests.s3 import Endpoint, seaweedfs
from tests.training import torchrun_env

pytestmark = pytest.mark.timeout(300)
OWNED = {0: [".metadata", "__0_0.distcp"], 1: ["__1_0.distcp"]}


@pytest.fixture(scope="module")
def weed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    with seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as found:
        yield found


def job(weed: Endpoint, work: Path, layout: str) -> tuple[str, list[dict[str, Any]]]:
    """Save then load under a 2-rank torchrun (`tests/s3_resume_job.py`); its stdout and its log events."""
    bucket = weed.new_bucket()
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "-m", "tests.s3_resume_job",
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


def test_each_rank_downloads_only_what_it_owns_into_its_nodes_cache(weed: Endpoint, tmp_path: Path) -> None:
    out, events = job(weed, tmp_path, "shared")
    assert loaded_as_saved(out), out
    downloaded = {e["rank"]: e["files"] for e in named(events, "resume_downloaded")}
    assert downloaded == OWNED
    assert named(events, "fetched_for_load") == [], "the node's cache held every file the load read"
    assert leftovers(tmp_path / "node") == [], "the cache is removed after"


def test_with_a_work_directory_per_rank_a_file_the_other_node_holds_is_fetched_for_the_load(
    weed: Endpoint, tmp_path: Path
) -> None:
    out, events = job(weed, tmp_path, "per-rank")
    assert loaded_as_saved(out), out
    assert {e["rank"]: e["files"] for e in named(events, "resume_downloaded")} == OWNED
    fetched = [(e["rank"], e["file"]) for e in named(events, "fetched_for_load")]
    assert fetched, "DCP keeps replicated items once, in one rank's file: the other rank reads it"
    assert all(file not in OWNED[rank] for rank, file in fetched), fetched
    assert [leftovers(tmp_path / f"node-{r}") for r in (0, 1)] == [[], []]


def test_a_file_fetched_for_the_load_is_verified_before_it_enters_the_cache(
    weed: Endpoint, tmp_path: Path
) -> None:
    bucket = weed.new_bucket()
    storage = weed.storage(bucket)
    written = storage.write(
        run_id="r1",
        step=3,
        epoch=0,
        shards=2,
        sources=[("__0_0.distcp", b"zero" * 1000), ("__1_0.distcp", b"one")],
    )
    cache, scratch = tmp_path / "download-x", tmp_path / "rank-1" / "fetch"
    cache.mkdir(mode=0o700)
    hook = FetchForLoad(storage, written.uri, written.manifest.files, cache, scratch, rank=1)
    hook("__0_0.distcp")
    assert (cache / "__0_0.distcp").read_bytes() == b"zero" * 1000 and os.listdir(scratch) == []
    (cache / "__1_0.distcp").write_bytes(b"one")  # as its owner on this node downloaded it
    weed.client().delete_object(Bucket=bucket, Key="ckpt/r1/step-3/__1_0.distcp")
    hook("__1_0.distcp")  # in the cache already: not fetched again

    (cache / "__0_0.distcp").unlink()
    weed.client().put_object(Bucket=bucket, Key="ckpt/r1/step-3/__0_0.distcp", Body=b"zerO" * 1000)
    with pytest.raises(Rejected, match=r"^file __0_0.distcp hash mismatch$"):
        hook("__0_0.distcp")
    assert not (cache / "__0_0.distcp").exists(), "a damaged file never enters the cache"
    with pytest.raises(Rejected, match=r"names file '../x', which the manifest does not list"):
        hook("../x")
    offline = FetchForLoad(
        weed.storage("no-such-bucket"), written.uri.replace(bucket, "no-such-bucket"), written.manifest.files,
        cache, scratch, rank=1,
    )  # fmt: skip
    with pytest.raises(StorageUnavailable, match=r"NoSuchBucket"):
        offline("__0_0.distcp")


def failures(*errors: BaseException) -> CheckpointException:
    """What DCP raises on every rank when reads failed: each failing rank's exception."""
    return CheckpointException("read", {rank: (e, traceback.StackSummary()) for rank, e in enumerate(errors)})


def test_a_failed_load_means_the_same_on_every_rank(tmp_path: Path) -> None:
    damaged, refused = Rejected("file __1_0.distcp hash mismatch"), ForbiddenPickle("item names os.system")
    assert load_failure(tmp_path, failures(ValueError("x"), damaged)) == "file __1_0.distcp hash mismatch"
    assert load_failure(tmp_path, failures(refused)) == "item names os.system"
    with pytest.raises(ResumeStopped, match=r"^storage unavailable: s3://b/k: timeout; nothing recorded"):
        load_failure(
            tmp_path, failures(damaged, StorageUnavailable("storage unavailable: s3://b/k: timeout"))
        )
    with pytest.raises(ResumeFailed, match=r"not a corrupt checkpoint: MemoryError: "):
        load_failure(tmp_path, failures(MemoryError()))
