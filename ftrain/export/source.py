"""The checkpoint an export reads: the one place it reaches the storage port.

A resume's own path, in one process: the step's URI confined to the run's location, its manifest read only
when its digest is the one the log's signed `checkpointed` event carries, every data file hashed against the
manifest before anything parses it (in place on a file system, downloaded into a private work directory on
object storage), and `.metadata` parsed through the allowlist from the bytes that matched. Nothing here
falls back to an older step: a refused checkpoint is named, and the export stops.
"""

import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from torch.distributed.checkpoint.metadata import Metadata

from ftrain.domain.lifecycle import CheckpointRef, RunState
from ftrain.errors import Refused
from ftrain.workers.dcp_reader import load_metadata
from ftrain.workers.manifest import FileEntry, Manifest
from ftrain.workers.storage.location import under_root
from ftrain.workers.storage.open import open_run
from ftrain.workers.storage.port import Readable
from ftrain.workers.storage.storage_errors import OUTSIDE_RUN, StorageError, StorageUnavailable
from ftrain.workers.storage.verdict import verify_files
from ftrain.workers.verified_chunks import Rejected


@dataclass(frozen=True)
class VerifiedCheckpoint:
    """A step readable locally, every byte checked: the directory DCP reads, its parsed metadata, the hook
    that fetches a file the directory lacks (verified before it is read), and the manifest."""

    path: Path
    metadata: Metadata
    fetch: Callable[[str], None] | None
    manifest: Manifest


@contextmanager
def verified_checkpoint(state: RunState, ref: CheckpointRef) -> Iterator[VerifiedCheckpoint]:
    """The checkpoint `ref` of the run in `state` (its log vouched for), verified; Refused naming what failed
    (a file, the manifest, the storage out of reach). What was downloaded is removed on exit."""
    where = f"checkpoint step {ref.step} of {state.run_id}"
    work = Path(tempfile.mkdtemp(prefix="ftrain-export-"))  # 0700: object storage downloads land here
    try:
        store = open_run(under_root(state.launch.storage, state.run_id), work)
        store.prepare(0, staged=False)
        uri = store.confined(ref.uri)
        if uri is None:
            raise Refused(f"{where}: {OUTSIDE_RUN}")
        manifest = store.read_manifest(uri, ref.checkpoint_hash, run_id=state.run_id, step=ref.step)
        if isinstance(manifest, str):
            raise Refused(f"{where} is refused: {manifest}")
        with store.readable(uri, manifest, manifest.files, start="export", rank=0) as local:
            verdict = local.verdict
            if verdict is None:  # an export reads in batches: check every file first
                verdict = _check_whole(local, [f for f in manifest.files if f.name in local.left])
            if isinstance(verdict, StorageUnavailable):
                raise verdict
            if verdict is not None:
                raise Refused(f"{where} is refused: {verdict}")
            metadata = load_metadata(local.path, manifest.files)
            if isinstance(metadata, str):
                raise Refused(f"{where} is refused: {metadata}")
            yield VerifiedCheckpoint(local.path, metadata, local.fetch, manifest)
    except StorageUnavailable as exc:
        raise Refused(f"{where}: {exc}; nothing written") from exc
    except StorageError as exc:
        raise Refused(f"{where}: {exc}") from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _check_whole(local: Readable, left: list[FileEntry]) -> str | None:
    """The files a resume would check chunk by chunk as it loads, checked whole before the export reads any:
    hashed in place, or, where the store left them for ranged reads (object storage), downloaded through the
    fetch hook, which verifies each before it lands. A defect is the verdict; storage out of reach raises."""
    if local.source is None or local.fetch is None:
        return verify_files(local.path, left)
    try:
        for entry in left:
            local.fetch(entry.name)
    except Rejected as exc:
        return str(exc)
    return None
