"""The torch.distributed.checkpoint read side: what DCP would unpickle goes through the allowlist.

DCP's own reader unpickles `.metadata` with `pickle.load` and its planner loads non-tensor items with
`torch.load(weights_only=False)`: both would run any global a hostile writer named. Here `.metadata` is read
into memory once (by rank 0 in a job, sent to every rank: `shared_metadata`), each rank checks those bytes
against the manifest (the bytes parsed are the bytes verified, not a second read of a file that may have
changed since) and unpickles them through `workers.unpickle`; DCP is handed the parsed metadata, and its
non-tensor items load through the same allowlist. Tensors DCP already loads with `weights_only=True`.
Every rank's verdict on what it read is `combined` the same way on each, so all ranks take the same way.

Data files whose entries list chunk digests (format 3) may be left unchecked until the load itself: the reader
then hands DCP each item's bytes from chunks verified for it (`workers.verified_chunks`), read from the local
files or from where the backend says (an object store's ranged reads), while threads check ahead, and fails the
load (Rejected) if any chunk of the files this rank answers for is wrong, read or not.
"""

import io
import os
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import torch.distributed as dist
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemReader, _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from ftrain.workers.integrity import Hashed, digest_of
from ftrain.workers.manifest import FileEntry
from ftrain.workers.storage.storage_errors import StorageUnavailable
from ftrain.workers.storage.verdict import absent, entry_verdict, file_verdict
from ftrain.workers.unpickle import RefusedPickle, restricted_loads, torch_load
from ftrain.workers.verified_chunks import ChunkSource, LocalChunks, VerifiedChunks
from ftrain.workers.verified_chunks import Rejected as Rejected

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
    """`.metadata` as rank 0 holds it under `path`, sent to every rank, each of which parses the bytes only
    once they match the manifest entry: on object storage the other nodes never downloaded it. Its absence
    from a directory that lists is a defect (the reason, on every rank), any other error the storage out of
    reach."""
    raw: bytes | str | StorageUnavailable = b""
    if dist.get_rank() == 0 and any(f.name == METADATA for f in files):
        try:
            raw = (path / METADATA).read_bytes()
        except OSError as exc:
            try:
                raw = absent(path / METADATA, path, exc, f"file {METADATA} missing")
            except StorageUnavailable as unreachable:
                raw = unreachable
    box: list[bytes | str | StorageUnavailable] = [raw]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0] if isinstance(box[0], str | StorageUnavailable) else parse_metadata(box[0], files)


def combined(verdict: Verdict, group: dist.ProcessGroup) -> str | None:
    """Every rank's verdict, combined the same way on each: the first rank's reason (None: all clean).
    Raises StorageUnavailable, on every rank alike, when any rank found the storage out of reach."""
    verdicts: list[Verdict] = [None] * dist.get_world_size()
    dist.all_gather_object(verdicts, verdict, group=group)
    if unavailable := next((v for v in verdicts if isinstance(v, StorageUnavailable)), None):
        raise unavailable
    return next((r for r in verdicts if isinstance(r, str)), None)


@dataclass(frozen=True)
class Unchecked:
    """The data files left for the load to verify chunk by chunk: the chunked entries of the manifest (by
    name) this rank did not check whole, and the names of those it answers for (each of their chunks is
    checked, read or not)."""

    entries: dict[str, FileEntry]
    owned: frozenset[str]
    source: ChunkSource | None = None
    """Where their chunks are read from; None: the files in the reader's directory."""


def unchecked(
    files: Sequence[FileEntry],
    owned: Sequence[FileEntry],
    left: Collection[str],
    source: ChunkSource | None = None,
) -> Unchecked:
    """The chunked files of a manifest but those of this rank's (`owned`) it checked whole before the load
    (not in `left`), read from `source`; `.metadata` is none of them: every rank checks it whole before the
    load (`parse_metadata`)."""
    mine = {f.name for f in owned}
    chunked = {
        f.name: f
        for f in files
        if f.chunked and f.name != METADATA and (f.name not in mine or f.name in left)
    }
    return Unchecked(chunked, frozenset(name for name in mine if name in chunked), source)


class VerifiedReader(FileSystemReader):
    """A FileSystemReader handed metadata already verified and parsed (`load_metadata`): it never reads
    `.metadata` itself. With `fetch`, each file the rank's plan reads is first handed to it by name: a file
    that is not in the verified directory yet is fetched and verified there (it raises Rejected or
    StorageUnavailable otherwise) before any of its bytes is parsed. With `unchecked`, the items of those
    files come from chunks verified as the load reads them (DCP's `_slice_file`, the one place it takes an
    item's bytes from a file), and the load fails (Rejected) unless every chunk this rank answers for checks."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        metadata: Metadata,
        fetch: Callable[[str], None] | None = None,
        unchecked: Unchecked | None = None,
    ) -> None:
        super().__init__(path)
        self.metadata = metadata
        self.fetch = fetch
        self.unchecked = unchecked
        self._chunks: VerifiedChunks | None = None

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        chunked = self.unchecked.entries if self.unchecked else {}
        if self.fetch is not None:
            for name in sorted({self.storage_data[item.storage_index].relative_path for item in plan.items}):
                if name not in chunked:
                    self.fetch(name)
        if self.unchecked is None:
            return super().read_data(plan, planner)
        infos: list[_StorageInfo] = [self.storage_data[item.storage_index] for item in plan.items]
        by_file: dict[str, list[_StorageInfo]] = {}
        for info in infos:  # DCP reads file by file, each file's items in the plan's order
            by_file.setdefault(info.relative_path, []).append(info)
        reads = [
            (i.relative_path, i.offset, i.length)
            for file in by_file.values()
            for i in file
            if i.relative_path in self.unchecked.entries
        ]
        source = self.unchecked.source or LocalChunks(Path(self.path))
        with VerifiedChunks(source, chunked, reads, self.unchecked.owned) as chunks:
            self._chunks = chunks
            local = self.fs
            self.fs = _Unopened(self.fs.concat_path(self.path, name) for name in chunked)
            try:
                done = super().read_data(plan, planner)
            finally:
                self._chunks = None
                self.fs = local
            chunks.finish()
        return done

    def _slice_file(self, file: Any, sinfo: _StorageInfo) -> IO[bytes]:
        if self._chunks is not None and self.unchecked and sinfo.relative_path in self.unchecked.entries:
            return cast(IO[bytes], self._chunks.read(sinfo.relative_path, sinfo.offset, sinfo.length))
        return super()._slice_file(file, sinfo)

    def read_metadata(self, *args: Any) -> Metadata:
        if self.metadata.storage_meta is None:
            self.metadata.storage_meta = StorageMeta()
        self.metadata.storage_meta.load_id = self.load_id
        return self.metadata


class _Unopened(FileSystem):
    """DCP's local file system, but for the files `paths` whose items come from verified chunks: they are not
    opened (DCP's stream of each goes unread)."""

    def __init__(self, paths: Iterable[str | os.PathLike[str]]) -> None:
        super().__init__()
        self.paths = {Path(p) for p in paths}

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        if Path(path) in self.paths:
            yield io.BytesIO()
            return
        with super().create_stream(path, mode) as stream:
            yield stream


class RestrictedLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, its non-tensor items unpickled through the allowlist."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        loaded = torch_load(value, f"item {fqn}")
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded
