"""The attempt fence on object storage: `workers.storage.file.fence_file` for a run whose checkpoints live on S3.

The log refuses a superseded attempt's events, not its writes: an old attempt that wakes up (a process stopped
and continued, a node cut off and back) could still seal steps the run never asked for. So the attempt's rank
0 claims the run with its number at start-up (the object `<prefix>/<run>/.attempt`, named in `workers.layout`;
read first, never lowered) and checks it right before it seals a step: a higher number means it has been
superseded. Read, then write, as on a file system: it stops an attempt that was superseded, not two started at
once (the log's conditional append refuses those).
"""

from ftrain.workers.layout import attempt_key
from ftrain.workers.storage.s3.bucket import Bucket, ObjectMissing
from ftrain.workers.storage.storage_errors import refuse


def owner(bucket: Bucket, run_key: str) -> int:
    """The attempt that last claimed the run under `run_key` (0: none has). StorageUnavailable when the store
    cannot say."""
    try:
        text = bucket.get(attempt_key(run_key)).decode("ascii", "replace").strip()
    except ObjectMissing:
        return 0
    return int(text) if text.isdigit() else 0  # unreadable: as on a file system, no claim


def claim(bucket: Bucket, run_key: str, attempt: int) -> None:
    """Claim the run for `attempt` (never lowers a newer claim). Raises Fenced when a newer attempt holds it."""
    check(bucket, run_key, attempt)
    bucket.put(attempt_key(run_key), str(attempt).encode())


def check(bucket: Bucket, run_key: str, attempt: int) -> None:
    """Raise Fenced when a newer attempt than `attempt` has claimed the run (named by its key's last segment)."""
    refuse(attempt, owner(bucket, run_key), run_key.rstrip("/").rpartition("/")[2])
