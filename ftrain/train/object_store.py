"""The trainer on object storage: where a run's checkpoints live on S3, and each rank's private work space.

A rank writes its shards to a node-local private directory (hashing as DCP writes them), uploads its own files
to `<root>/<run>/step-N/`, and rank 0 seals the step once every upload is in; a resume downloads the step into
a private cache (hashing as the bytes arrive) and loads from there only after every file matched.
"""

from pathlib import Path

from workers.layout import rank_stage_dir
from workers.storage.s3_store import S3Storage, parse_s3_uri


def run_storage(location: str) -> tuple[S3Storage, str]:
    """The backend of `s3://bucket[/prefix]/<run>` and the run's name (the last segment)."""
    root, _, run = location.rstrip("/").rpartition("/")
    bucket, prefix = parse_s3_uri(root)
    return S3Storage(bucket, prefix), run


def write_dir(work: Path, rank: int) -> Path:
    """Where a rank writes a step's shards before uploading them."""
    return rank_stage_dir(work, rank) / "upload"


def cache_dir(work: Path, rank: int) -> Path:
    """Where a rank downloads a step before loading it."""
    return rank_stage_dir(work, rank) / "download"
