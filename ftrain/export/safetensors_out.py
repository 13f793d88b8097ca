"""The model's weights as safetensors, one tensor batch in memory at a time (`export.safetensors_format`)."""

from pathlib import Path
from typing import BinaryIO

import torch

from ftrain.errors import Refused
from ftrain.export import safetensors_format as st
from ftrain.export import tensors
from ftrain.export.source import VerifiedCheckpoint
from ftrain.export.written import Written, write_new


def write_safetensors(source: VerifiedCheckpoint, out: Path, max_shard: int) -> list[Written]:
    """The checkpoint's model weights under `out`: `model.safetensors`, or shards of at most `max_shard`
    data bytes and their index. Refused when the model holds a value safetensors cannot (not a tensor, a
    dtype it has no name for)."""
    items = tensors.items(source, tensors.MODEL)
    if not items:
        raise Refused("the checkpoint holds no model weights (nothing saved under app.model)")
    described = [_described(item) for item in items]
    by_name = {str(item.path[0]): item for item in items}
    files = st.shards(described, max_shard)
    names = st.shard_names(len(files))
    written = []
    for shard, name in zip(files, names, strict=True):

        def fill(f: BinaryIO, shard: list[st.Tensor] = shard) -> None:
            f.write(st.header(shard))
            for batch in tensors.batches([by_name[t.name] for t in shard]):
                loaded = tensors.load(source, batch)
                for item in batch:
                    f.write(loaded.pop(item.key).reshape(-1).view(torch.uint8).numpy())

        written.append(write_new(out / name, fill))
    if len(files) > 1:
        written.append(write_new(out / st.INDEX, lambda f: f.write(st.index(files, names))))
    return written


def _described(item: tensors.Item) -> st.Tensor:
    """What the safetensors header says of a model entry, or why it cannot hold it."""
    name = item.path[0]
    if item.dtype is None or item.shape is None:
        raise Refused(
            f"model entry {name!r} is not a tensor: safetensors holds tensors only; use --format torch"
        )
    dtype = st.DTYPES.get(str(item.dtype).removeprefix("torch."))
    if dtype is None:
        raise Refused(
            f"model entry {name!r} is {item.dtype}, which safetensors has no name for; use --format torch"
        )
    return st.Tensor(str(name), dtype, item.shape, item.nbytes)
