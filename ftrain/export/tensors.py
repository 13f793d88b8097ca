"""Reading a verified checkpoint's items a few at a time, so an export never holds the whole model.

DCP loads into whatever state dict it is handed and reads only what that asks for: each batch of keys gets
tensors preallocated from the checkpoint's metadata (whole, whatever sharding saved them), filled through the
verified reader, its non-tensor items unpickled through the allowlist. The trainer saves its state under
`app` (`{"app": TrainState}`); the model's entries sit at `("app", "model", <name>)` in the metadata's
paths, their names those of `model.state_dict()`, and the optimizer's under `("app", "optim", ...)`.
"""

import warnings
from collections.abc import Sequence
from typing import Any, Final, NamedTuple

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from ftrain.errors import Refused
from ftrain.export.safetensors_format import cut
from ftrain.export.source import VerifiedCheckpoint
from ftrain.train.resume_load import ResumeFailed, ResumeStopped, load_failure
from ftrain.workers.dcp_reader import RestrictedLoadPlanner, VerifiedReader

MODEL: Final = ("app", "model")
OPTIMIZER: Final = ("app", "optim")
BATCH_BYTES: Final = 64 << 20
"""How many bytes of tensors one load reads at most (a larger tensor is read alone): the export's memory."""


class Item(NamedTuple):
    """One saved entry: its key in the checkpoint, its path below the container it belongs to, and for a
    tensor its dtype, shape and size in bytes (None, None, 0: a pickled value)."""

    key: str
    path: tuple[str | int, ...]
    dtype: torch.dtype | None
    shape: tuple[int, ...] | None
    nbytes: int


def items(source: VerifiedCheckpoint, container: tuple[str, ...]) -> list[Item]:
    """The entries saved under `container` (MODEL, OPTIMIZER), in the order they were saved."""
    metadata = source.metadata
    paths: dict[str, tuple[str | int, ...]] = metadata.planner_data or {}
    found = []
    for key, md in metadata.state_dict_metadata.items():
        path = tuple(paths.get(key, (key,)))
        if path[: len(container)] != container or len(path) == len(container):
            continue
        if isinstance(md, TensorStorageMetadata):
            shape = tuple(md.size)
            nbytes = md.size.numel() * md.properties.dtype.itemsize
            found.append(Item(key, path[len(container) :], md.properties.dtype, shape, nbytes))
        else:
            found.append(Item(key, path[len(container) :], None, None, 0))
    return found


def batches(wanted: Sequence[Item], budget: int = BATCH_BYTES) -> list[list[Item]]:
    """`wanted` in order, cut into runs of at most `budget` tensor bytes (a larger tensor alone)."""
    return cut(wanted, lambda item: item.nbytes, budget)


def load(source: VerifiedCheckpoint, wanted: Sequence[Item]) -> dict[str, Any]:
    """The values of `wanted`, by key: tensors whole on the CPU, pickled values through the allowlist.
    Refused when a file or pickle the load reads is refused, or the storage is out of reach."""
    state: dict[str, Any] = {
        item.key: None if item.dtype is None else torch.empty(item.shape or (), dtype=item.dtype)
        for item in wanted
    }
    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            dcp_load(
                state,
                storage_reader=VerifiedReader(source.path, source.metadata, source.fetch),
                planner=RestrictedLoadPlanner(),
                no_dist=True,
            )
    except CheckpointException as exc:
        try:
            reason = load_failure(source.path, exc)
        except (ResumeStopped, ResumeFailed) as failed:
            raise Refused(str(failed)) from exc
        raise Refused(f"{source.path}: {reason}") from exc
    return state
