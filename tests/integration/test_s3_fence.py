"""The attempt fence on S3 (`workers.storage.s3.fence_object`) against real SeaweedFS and moto servers: a claim is
never lowered, a superseded attempt is refused in one line, the fence object is never taken for a step, and a
store out of reach is never read as "no claim"."""

import pytest

from ftrain.workers.layout import ATTEMPT
from ftrain.workers.storage.s3.run_prefix import S3Run
from ftrain.workers.storage.storage_errors import Fenced, StorageUnavailable
from tests.support.s3 import Endpoint, write_whole

RUN = "r1"


@pytest.fixture
def run(s3: Endpoint) -> S3Run:
    return s3.run(s3.new_bucket(), RUN)


def test_a_claim_is_never_lowered_and_a_superseded_attempt_is_refused(s3: Endpoint, run: S3Run) -> None:
    assert run.owner() == 0
    run.check(0)  # nothing claimed: nothing fenced
    run.claim(1)
    run.claim(3)
    run.claim(3)  # the same attempt again (a restart in place)
    with pytest.raises(Fenced, match=r"^attempt 2 is superseded by attempt 3 of r1; writing nothing$"):
        run.claim(2)
    assert run.owner() == 3
    run.check(3)
    with pytest.raises(Fenced, match="attempt 1 is superseded by attempt 3"):
        run.check(1)
    assert s3.run(run.bucket.name, "another-run").owner() == 0, "each run has its own fence"


def test_the_fence_is_no_step_to_list_clean_prune_or_set_aside(s3: Endpoint, run: S3Run) -> None:
    run.claim(2)
    for step in (10, 20, 30):
        write_whole(run, step=step, epoch=0, shards=1, sources=[("state.json", b"{}")])
    assert [d.step for d in run.complete()] == [30, 20, 10]
    assert run.clean() == []
    assert run.prune([10], 2) == [10]
    for step in (30, 20):
        run.quarantine(f"{run.location.uri}/step-{step}", "corrupt", "1")
    assert run.complete() == []
    fence = f"ckpt/{RUN}/{ATTEMPT}"
    listed = s3.client().list_objects_v2(Bucket=run.bucket.name, Prefix=fence)["Contents"]
    assert [o["Key"] for o in listed] == [fence]
    assert run.owner() == 2


def test_a_store_out_of_reach_is_unavailable_never_no_claim(s3: Endpoint) -> None:
    gone = s3.run("no-such-bucket-f", RUN)
    for call in (
        lambda: gone.owner(),
        lambda: gone.check(1),
        lambda: gone.claim(1),
    ):
        with pytest.raises(
            StorageUnavailable,
            match=r"^storage unavailable: s3://no-such-bucket-f/ckpt/r1/\.attempt: NoSuchBucket",
        ):
            call()
