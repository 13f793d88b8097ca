"""The S3 resume's fetch hook against a real SeaweedFS: a file fetched for the load is verified before it
enters the cache, a store out of reach stops (the resume under real torchrun jobs:
tests/e2e/test_s3_resume.py; a failed load's verdict: tests/unit/test_resume_load_failure.py)."""

import os
from pathlib import Path

import pytest

from ftrain.workers.dcp_reader import Rejected
from ftrain.workers.storage.s3.run_prefix import FetchForLoad
from ftrain.workers.storage.storage_errors import StorageUnavailable
from tests.support.s3 import Endpoint, write_whole

pytestmark = pytest.mark.timeout(300)


def test_a_file_fetched_for_the_load_is_verified_before_it_enters_the_cache(
    weed: Endpoint, tmp_path: Path
) -> None:
    bucket = weed.new_bucket()
    run = weed.run(bucket, "r1")
    written = write_whole(
        run,
        step=3,
        epoch=0,
        shards=2,
        sources=[("__0_0.distcp", b"zero" * 1000), ("__1_0.distcp", b"one")],
    )
    cache, scratch = tmp_path / "download-x", tmp_path / "rank-1" / "fetch"
    cache.mkdir(mode=0o700)
    hook = FetchForLoad(run.bucket, written.uri, written.manifest.files, cache, scratch, rank=1)
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
        weed.run("no-such-bucket", "r1").bucket, written.uri.replace(bucket, "no-such-bucket"), written.manifest.files,
        cache, scratch, rank=1,
    )  # fmt: skip
    with pytest.raises(StorageUnavailable, match=r"NoSuchBucket"):
        offline("__0_0.distcp")
