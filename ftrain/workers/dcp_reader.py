"""The torch.distributed.checkpoint read side: what DCP would unpickle goes through the allowlist.

DCP's own reader unpickles `.metadata` with `pickle.load` and its planner loads non-tensor items with
`torch.load(weights_only=False)`: both would run any global a hostile writer named. Here `.metadata` is read
into memory once (by rank 0 in a job, sent to every rank: `shared_metadata`), each rank checks those bytes
against the manifest (the bytes parsed are the bytes verified, not a second read of a file that may have
changed since) and unpickles them through `workers.unpickle`; DCP is handed the parsed metadata, and its
non-tensor items load through the same allowlist. Tensors DCP already loads with `weights_only=True`.
Every rank's verdict on what it read is `combined` the same way on each, so all ranks take the same way.
"""

import io
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from ftrain.workers.integrity import Hashed, digest_of
from ftrain.workers.manifest import FileEntry
from ftrain.workers.storage.storage_errors import StorageUnavailable
from ftrain.workers.storage.verdict import entry_verdict, file_verdict
from ftrain.workers.unpickle import RefusedPickle, restricted_loads, torch_load

METADATA = ".metadata"
Verdict = str | StorageUnavailable | None
"""One rank's judgement: None (clean), why the checkpoint is refused, or the storage out of reach."""


def load_metadata(path: Path, files: Sequence[FileEntry]) -> Metadata | str:
    """The checkpoint's DCP metadata, parsed only once its bytes match the manifest entry; else why not
    (the same verdicts as a file check, or the global the pickle names). Raises StorageUnavailable."""
    entry = next((f for f in files if f.name == METADATA), None)
    if entry is None:
        return f"manifest lists no {METADATA}"
    try:
        raw = (path / METADATA).read_bytes()
    except OSError as exc:
        return file_verdict(path, entry, exc) or f"file {METADATA} unreadable"
    return parse_metadata(raw, files)


def parse_metadata(raw: bytes, files: Sequence[FileEntry]) -> Metadata | str:
    """`raw`, the bytes of `.metadata` (read here or received from the rank that downloaded them), parsed
    through the allowlist once they match the manifest entry; else why not."""
    entry = next((f for f in files if f.name == METADATA), None)
    if entry is None:
        return f"manifest lists no {METADATA}"
    if reason := entry_verdict(entry, Hashed(len(raw), digest_of(raw, entry.algorithm))):
        return reason
    try:
        metadata = restricted_loads(raw, f"`{METADATA}`")
    except RefusedPickle as exc:  # hostile or malformed, yet it matched its manifest: its writer wrote it so
        return str(exc)
    if not isinstance(metadata, Metadata):
        return f"file {METADATA} holds a {type(metadata).__name__}, not DCP metadata"
    return metadata


def shared_metadata(
    path: Path, files: Sequence[FileEntry], group: dist.ProcessGroup
) -> Metadata | str | StorageUnavailable:
    """`.metadata` as rank 0 holds it under `path` (verified with its own files), sent to every rank, each of
    which parses the bytes only once they match the manifest entry: on object storage the other nodes never
    downloaded it."""
    raw: bytes | StorageUnavailable = b""
    if dist.get_rank() == 0 and any(f.name == METADATA for f in files):
        try:
            raw = (path / METADATA).read_bytes()
        except OSError as exc:
            raw = StorageUnavailable(f"{path}: {exc}")
    box: list[bytes | StorageUnavailable] = [raw]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0] if isinstance(box[0], StorageUnavailable) else parse_metadata(box[0], files)


def combined(verdict: Verdict, group: dist.ProcessGroup) -> str | None:
    """Every rank's verdict, combined the same way on each: the first rank's reason (None: all clean).
    Raises StorageUnavailable, on every rank alike, when any rank found the storage out of reach."""
    verdicts: list[Verdict] = [None] * dist.get_world_size()
    dist.all_gather_object(verdicts, verdict, group=group)
    if unavailable := next((v for v in verdicts if isinstance(v, StorageUnavailable)), None):
        raise unavailable
    return next((r for r in verdicts if isinstance(r, str)), None)


class Rejected(Exception):
    """A file a load needs failed verification when it was fetched for the load: the checkpoint is corrupt
    (DCP hands it to every rank, so all skip the checkpoint together)."""


class VerifiedReader(FileSystemReader):
    """A FileSystemReader handed metadata already verified and parsed (`load_metadata`): it never reads
    `.metadata` itself. With `fetch`, each file the rank's plan reads is first handed to it by name: a file
    that is not in the verified directory yet is fetched and verified there (it raises Rejected or
    StorageUnavailable otherwise) before any of its bytes is parsed."""

    def __init__(
        self, path: str | os.PathLike[str], metadata: Metadata, fetch: Callable[[str], None] | None = None
    ) -> None:
        super().__init__(path)
        self.metadata = metadata
        self.fetch = fetch

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        if self.fetch is not None:
            for name in sorted({self.storage_data[item.storage_index].relative_path for item in plan.items}):
                self.fetch(name)
        return super().read_data(plan, planner)

    def read_metadata(self, *args: Any) -> Metadata:
        if self.metadata.storage_meta is None:
            self.metadata.storage_meta = StorageMeta()
        self.metadata.storage_meta.load_id = self.load_id
        return self.metadata


class RestrictedLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, its non-tensor items unpickled through the allowlist."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        loaded = torch_load(value, f"item {fqn}")
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded
