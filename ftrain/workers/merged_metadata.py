"""One DCP metadata over several parts of a memory snapshot, so one load reads any saving rank's items.

Each rank writes its part of a snapshot alone (`no_dist`): its `.metadata` describes only its own items, a
sharded tensor's chunks at their global offsets, its files named within its own directory. Merged, the
parts read as one checkpoint from the snapshot's directory: every tensor's chunks from every part (a chunk
several parts hold alike, as replicated weights and optimizer steps are, from the first), any other item
from the first part that holds it, every file named by its part's directory. DCP's load planner then finds,
for whatever world loads it, the chunks that cover each rank's shards: the resharding load.
"""

from collections.abc import Sequence
from dataclasses import replace

from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    STORAGE_TYPES,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)


def merged(parts: Sequence[tuple[str, Metadata]]) -> Metadata | str:
    """The metadata of `parts` (each a directory and its part's parsed, verified metadata) as one checkpoint's
    (see the module); why not when two parts disagree on an item (its kind, or a tensor's global size)."""
    items: dict[str, STORAGE_TYPES] = {}
    storage: dict[MetadataIndex, _StorageInfo] = {}
    planner: dict[str, object] = {}
    for directory, metadata in parts:
        for fqn, meta in metadata.state_dict_metadata.items():
            held = items.get(fqn)
            if held is None:
                items[fqn] = held = (
                    TensorStorageMetadata(meta.properties, meta.size, [])
                    if isinstance(meta, TensorStorageMetadata)
                    else meta
                )
                if not isinstance(meta, TensorStorageMetadata):
                    storage[MetadataIndex(fqn)] = _placed(metadata, MetadataIndex(fqn), directory)
            if isinstance(meta, TensorStorageMetadata) != isinstance(held, TensorStorageMetadata):
                return f"the parts disagree on {fqn}: a tensor in one, not in another"
            if not isinstance(meta, TensorStorageMetadata) or not isinstance(held, TensorStorageMetadata):
                continue
            if meta.size != held.size:
                return f"the parts disagree on {fqn}'s size: {list(held.size)} and {list(meta.size)}"
            for chunk in meta.chunks:
                if any(c.offsets == chunk.offsets and c.sizes == chunk.sizes for c in held.chunks):
                    continue
                held.chunks.append(chunk)
                index = MetadataIndex(fqn, chunk.offsets, len(held.chunks) - 1)
                storage[index] = _placed(metadata, MetadataIndex(fqn, chunk.offsets), directory)
        if isinstance(metadata.planner_data, dict):
            planner = {**metadata.planner_data, **planner}
    return Metadata(items, planner_data=planner, storage_data=storage)


def _placed(metadata: Metadata, index: MetadataIndex, directory: str) -> _StorageInfo:
    """Where `index`'s bytes lie in a part, named from the snapshot's directory."""
    info: _StorageInfo = metadata.storage_data[index]
    return replace(info, relative_path=f"{directory}/{info.relative_path}")
