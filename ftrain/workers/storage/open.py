"""The one factory of the storage port, and the one module above the backends that knows them: the backend
a run's `Location` names, by scheme."""

from pathlib import Path
from urllib.parse import urlparse

from ftrain.workers.storage.file.run_dir import FileRun
from ftrain.workers.storage.location import Location
from ftrain.workers.storage.port import RunStorage


def open_run(location: Location, stage_dir: Path | None = None) -> RunStorage:
    """One run's checkpoints in the three roles of the port. `stage_dir` is this node's private work space
    (async staging; on object storage every upload and download of a trainer's ranks); a process that only
    writes and reads whole steps from where its files are (the CLI) has none."""
    if location.backend == "s3":
        from ftrain.workers.storage.s3.run_prefix import S3Run  # boto3 only where S3 is used

        return S3Run(location, stage_dir)
    return FileRun(location, stage_dir)


def is_object_storage(text: str) -> bool:
    """The storage URI names an object store."""
    return urlparse(text).scheme == "s3"
