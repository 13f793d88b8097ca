"""The trainer on object storage: where a run's checkpoints live on S3, and each node's work space.

A rank writes its shards to a node-local private directory (hashing as DCP writes them), uploads its own files
to `<root>/<run>/step-N/`, and rank 0 seals the step once every upload is in. A resume downloads into one cache
per node, shared by the node's ranks (each writes only the files it owns), named for the start and the step so
a crashed start's leftovers are never taken for this one's; a rank's own scratch space receives a file fetched
for its load, verified there before it is renamed into the cache.
"""

import os
from pathlib import Path

from ftrain.workers.layout import rank_stage_dir
from ftrain.workers.s3.client import shared_client
from ftrain.workers.storage.s3_store import S3Storage, parse_s3_uri

_CACHE = "download-"


def run_storage(location: str) -> tuple[S3Storage, str]:
    """The backend of `s3://bucket[/prefix]/<run>` (on the process's shared client) and the run's name (the
    last segment)."""
    root, _, run = location.rstrip("/").rpartition("/")
    bucket, prefix = parse_s3_uri(root)
    return S3Storage(bucket, prefix, shared_client()), run


def write_dir(work: Path, rank: int) -> Path:
    """Where a rank writes a step's shards before uploading them."""
    return rank_stage_dir(work, rank) / "upload"


def cache_name(start: str, step: int) -> str:
    """The name, in a node's work directory, of its cache of `step` for the start named `start`."""
    return f"{_CACHE}{start}-step-{step}"


def stale_caches(work: Path, current: str) -> list[str]:
    """The caches in `work` other than `current`: left by a start that did not finish."""
    return [name for name in os.listdir(work) if name.startswith(_CACHE) and name != current]


def fetch_dir(work: Path, rank: int) -> Path:
    """Where a rank fetches a file its load needs and its node's cache lacks, before renaming it in."""
    return rank_stage_dir(work, rank) / "fetch"
