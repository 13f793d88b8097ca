"""The safetensors layout, written without holding a file's tensors: the header is made from the shapes and
dtypes alone (the checkpoint's metadata knows them), then each tensor's bytes follow in header order.

A file is an 8-byte little-endian header length, a JSON header (each tensor's dtype, shape and byte range
within the data; `__metadata__` `{"format": "pt"}`, which transformers requires), padded with spaces to a
multiple of 8 so the data starts aligned, then the data. Shards are cut as Hugging Face cuts them (a tensor
goes to the next file when it would take the current one past the limit; a larger tensor gets a file to
itself) and named `model-00001-of-00003.safetensors`, with `model.safetensors.index.json` mapping each tensor
to its file; a model that fits in one file is `model.safetensors`, without an index.
"""

import json
import re
import struct
from collections.abc import Callable, Sequence
from typing import Final, NamedTuple, TypeVar

T = TypeVar("T")
SINGLE: Final = "model.safetensors"
INDEX: Final = "model.safetensors.index.json"
DEFAULT_MAX_SHARD: Final = "5GB"
DTYPES: Final = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2", "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint64": "U64",
    "uint32": "U32", "uint16": "U16", "uint8": "U8", "bool": "BOOL", "complex64": "C64",
}  # fmt: skip
"""torch's dtype names (`torch.float32` → "float32") and safetensors' names for them."""
_UNITS: Final = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
                 "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}  # fmt: skip


class Tensor(NamedTuple):
    """What the header says of one tensor: its name, safetensors dtype, shape and size in bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


def parse_size(text: str) -> int:
    """A shard size as Hugging Face writes it (`5GB` = 5·10⁹ bytes, `500MiB`, `1000000`); ValueError else."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*", text, re.IGNORECASE)
    if not match:
        raise ValueError(f"{text!r} is not a size (e.g. 5GB, 500MiB, 1000000)")
    size = int(float(match.group(1)) * _UNITS[(match.group(2) or "").upper()])
    if size <= 0:
        raise ValueError(f"{text!r}: a shard must hold at least one byte")
    return size


def cut(items: Sequence[T], size: Callable[[T], int], limit: int) -> list[list[T]]:
    """`items` in order, cut into runs of at most `limit` bytes (by `size`) as Hugging Face cuts shards: an
    item goes to the next run when it would take the current one past the limit; a larger item runs alone."""
    runs: list[list[T]] = []
    total = 0
    for item in items:
        if not runs or (runs[-1] and total + size(item) > limit):
            runs.append([])
            total = 0
        runs[-1].append(item)
        total += size(item)
    return runs


def shards(tensors: Sequence[Tensor], max_size: int) -> list[list[Tensor]]:
    """`tensors` in order, cut into files of at most `max_size` data bytes (a larger tensor alone)."""
    return cut(tensors, lambda t: t.nbytes, max_size) or [[]]


def shard_names(count: int) -> list[str]:
    """The files `count` shards are written to."""
    if count == 1:
        return [SINGLE]
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def header(tensors: Sequence[Tensor]) -> bytes:
    """The length prefix and padded JSON header of a file holding `tensors`, their data in this order."""
    entries: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for tensor in tensors:
        entries[tensor.name] = {
            "dtype": tensor.dtype,
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + tensor.nbytes],
        }
        offset += tensor.nbytes
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def index(files: Sequence[Sequence[Tensor]], names: Sequence[str]) -> bytes:
    """`model.safetensors.index.json`: the tensors' total data size and which file holds each."""
    weight_map = {t.name: name for tensors, name in zip(files, names, strict=True) for t in tensors}
    total = sum(t.nbytes for tensors in files for t in tensors)
    doc = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    return (json.dumps(doc, indent=2) + "\n").encode()
