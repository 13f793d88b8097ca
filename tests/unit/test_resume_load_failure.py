"""A failed DCP load means the same on every rank: each rank's exceptions become one verdict, a corrupt
checkpoint, a stop (storage out of reach) or a failure that is no corruption (the fetch hook against a real
SeaweedFS: tests/integration/test_s3_resume.py)."""

import traceback
from pathlib import Path

import pytest
from torch.distributed.checkpoint.api import CheckpointException

from ftrain.train.resume_load import ResumeFailed, ResumeStopped, load_failure
from ftrain.workers.dcp_reader import Rejected
from ftrain.workers.storage.storage_errors import StorageUnavailable
from ftrain.workers.unpickle import ForbiddenPickle


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
