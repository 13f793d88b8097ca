"""The attempt fence on S3 (`workers.storage.s3.fence_object`) against real SeaweedFS and moto servers: a claim is
never lowered, a superseded attempt is refused in one line, the fence object is never taken for a step, and a
store out of reach is never read as "no claim"."""

import pytest

from ftrain.workers.layout import ATTEMPT
from ftrain.workers.storage.s3 import fence_object
from ftrain.workers.storage.s3.root_store import S3Storage
from ftrain.workers.storage.storage_errors import Fenced, StorageUnavailable
from tests.support.s3 import Endpoint, write_whole

RUN = "r1"


@pytest.fixture
def storage(s3: Endpoint) -> S3Storage:
    return s3.storage(s3.new_bucket())


def test_a_claim_is_never_lowered_and_a_superseded_attempt_is_refused(storage: S3Storage) -> None:
    assert fence_object.owner(storage, RUN) == 0
    fence_object.check(storage, RUN, 0)  # nothing claimed: nothing fenced
    fence_object.claim(storage, RUN, 1)
    fence_object.claim(storage, RUN, 3)
    fence_object.claim(storage, RUN, 3)  # the same attempt again (a restart in place)
    with pytest.raises(Fenced, match=r"^attempt 2 is superseded by attempt 3 of r1; writing nothing$"):
        fence_object.claim(storage, RUN, 2)
    assert fence_object.owner(storage, RUN) == 3
    fence_object.check(storage, RUN, 3)
    with pytest.raises(Fenced, match="attempt 1 is superseded by attempt 3"):
        fence_object.check(storage, RUN, 1)
    assert fence_object.owner(storage, "another-run") == 0, "each run has its own fence"


def test_the_fence_is_no_step_to_list_clean_prune_or_set_aside(s3: Endpoint, storage: S3Storage) -> None:
    fence_object.claim(storage, RUN, 2)
    for step in (10, 20, 30):
        write_whole(storage, run_id=RUN, step=step, epoch=0, shards=1, sources=[("state.json", b"{}")])
    assert [d.step for d in storage.complete(RUN)] == [30, 20, 10]
    assert storage.clean(RUN) == []
    assert storage.prune(RUN, [10]) == [10]
    for step in (30, 20):
        storage.quarantine(storage.step_uri(RUN, step), "corrupt", "1")
    assert storage.complete(RUN) == []
    fence = f"ckpt/{RUN}/{ATTEMPT}"
    listed = s3.client().list_objects_v2(Bucket=storage.bucket, Prefix=fence)["Contents"]
    assert [o["Key"] for o in listed] == [fence]
    assert fence_object.owner(storage, RUN) == 2


def test_a_store_out_of_reach_is_unavailable_never_no_claim(s3: Endpoint) -> None:
    gone = s3.storage("no-such-bucket-f")
    for call in (
        lambda: fence_object.owner(gone, RUN),
        lambda: fence_object.check(gone, RUN, 1),
        lambda: fence_object.claim(gone, RUN, 1),
    ):
        with pytest.raises(
            StorageUnavailable,
            match=r"^storage unavailable: s3://no-such-bucket-f/ckpt/r1/\.attempt: NoSuchBucket",
        ):
            call()
