"""The attempt fence on S3 (`workers.storage.s3_fence`) against real SeaweedFS and moto servers: a claim is
never lowered, a superseded attempt is refused in one line, the fence object is never taken for a step, and a
store out of reach is never read as "no claim"."""

import pytest

from ftrain.workers.fence import Fenced
from ftrain.workers.layout import ATTEMPT
from ftrain.workers.storage import s3_fence
from ftrain.workers.storage.errors import StorageUnavailable
from ftrain.workers.storage.s3_store import S3Storage
from tests.support.s3 import Endpoint

RUN = "r1"


@pytest.fixture
def storage(s3: Endpoint) -> S3Storage:
    return s3.storage(s3.new_bucket())


def test_a_claim_is_never_lowered_and_a_superseded_attempt_is_refused(storage: S3Storage) -> None:
    assert s3_fence.owner(storage, RUN) == 0
    s3_fence.check(storage, RUN, 0)  # nothing claimed: nothing fenced
    s3_fence.claim(storage, RUN, 1)
    s3_fence.claim(storage, RUN, 3)
    s3_fence.claim(storage, RUN, 3)  # the same attempt again (a restart in place)
    with pytest.raises(Fenced, match=r"^attempt 2 is superseded by attempt 3 of r1; writing nothing$"):
        s3_fence.claim(storage, RUN, 2)
    assert s3_fence.owner(storage, RUN) == 3
    s3_fence.check(storage, RUN, 3)
    with pytest.raises(Fenced, match="attempt 1 is superseded by attempt 3"):
        s3_fence.check(storage, RUN, 1)
    assert s3_fence.owner(storage, "another-run") == 0, "each run has its own fence"


def test_the_fence_is_no_step_to_list_clean_prune_or_set_aside(s3: Endpoint, storage: S3Storage) -> None:
    s3_fence.claim(storage, RUN, 2)
    for step in (10, 20, 30):
        storage.write(run_id=RUN, step=step, epoch=0, shards=1, sources=[("state.json", b"{}")])
    assert [d.step for d in storage.complete(RUN)] == [30, 20, 10]
    assert storage.clean(RUN) == []
    assert storage.prune(RUN, [10]) == [10]
    for step in (30, 20):
        storage.quarantine(storage.step_uri(RUN, step), "corrupt", "1")
    assert storage.complete(RUN) == []
    fence = f"ckpt/{RUN}/{ATTEMPT}"
    listed = s3.client().list_objects_v2(Bucket=storage.bucket, Prefix=fence)["Contents"]
    assert [o["Key"] for o in listed] == [fence]
    assert s3_fence.owner(storage, RUN) == 2


def test_a_store_out_of_reach_is_unavailable_never_no_claim(s3: Endpoint) -> None:
    gone = s3.storage("no-such-bucket-f")
    for call in (
        lambda: s3_fence.owner(gone, RUN),
        lambda: s3_fence.check(gone, RUN, 1),
        lambda: s3_fence.claim(gone, RUN, 1),
    ):
        with pytest.raises(
            StorageUnavailable,
            match=r"^storage unavailable: s3://no-such-bucket-f/ckpt/r1/\.attempt: NoSuchBucket",
        ):
            call()
