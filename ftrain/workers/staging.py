"""Stage a state dict into reusable, preallocated host buffers: the only stall an async save puts on training.

The buffers are allocated ahead (`reserve`, at start-up once a resumed state is loaded) or at the first save,
and reused (`copy_` into preallocated memory runs at memcpy speed; a fresh `clone()` runs 4-6x slower here),
pinned when the state lives on a GPU so the copy is a DMA. They are made by torch's own staging helper, the
one `dcp.async_save` uses, so DTensor shards and pinned memory are laid out as torch lays them out. The copy
walks the state and its buffers together, checking each tensor's shape and dtype on the way (a buffer of
another shape could broadcast silently): one pass, where a layout walk before torch's copy helper cost an
async save of the reference state ~8 ms of its ~80 ms stall (docs/benchmarks.md).
"""

import copy
from typing import Any

import torch
from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
from torch.distributed.tensor import DTensor


class LayoutChanged(Exception):
    """The state no longer fits the buffers: a key, a length, a tensor's type, shape or dtype changed."""


class StagingBuffers:
    """Host copies of a state dict, rewritten in place at every save."""

    def __init__(self) -> None:
        self._cache: dict[str, Any] | None = None
        self.pin = torch.cuda.is_available()

    def reserve(self, state: dict[str, Any]) -> dict[str, Any]:
        """Buffers for `state`: those allocated before, or new ones at the first call."""
        if self._cache is None:
            self._cache = _create_cpu_state_dict(state, pin_memory=self.pin)
        return self._cache

    def stage(self, state: dict[str, Any]) -> dict[str, Any]:
        """Copy `state` into the buffers; returns the staged copy (valid until the next `stage`). A state that
        changed its layout (optimizer state appeared, a tensor changed shape or dtype) gets new buffers."""
        staged: dict[str, Any]
        try:
            staged = _copy_into(state, self.reserve(state), self.pin)
        except LayoutChanged:
            self._cache = None
            staged = _copy_into(state, self.reserve(state), self.pin)
        if self.pin:
            torch.cuda.synchronize()
        return staged


def _copy_into(value: Any, buffer: Any, non_blocking: bool) -> Any:
    """`value` (a nested state dict) copied into `buffer`, made for its layout by `_create_cpu_state_dict`;
    returns the staged value. Tensors are copied into their buffers, numbers and strings kept (immutable),
    anything else (a NumPy scalar, a datetime: what the unpickler allows) deep-copied, as the buffers were made.
    Raises LayoutChanged where they differ."""
    if isinstance(value, DTensor):
        if not isinstance(buffer, DTensor):
            raise LayoutChanged
        # the shards themselves, not to_local(): an autograd call, 15 µs a tensor
        _copy_tensor(buffer._local_tensor, value._local_tensor, non_blocking)
        return buffer
    if type(value) in _PLAIN_TENSORS:
        if type(buffer) not in _PLAIN_TENSORS:
            raise LayoutChanged
        _copy_tensor(buffer, value, non_blocking)
        return buffer
    if isinstance(value, torch.Tensor):  # another kind (a ShardedTensor): torch's own copy, its type checked
        if type(buffer) is not type(value) or buffer.shape != value.shape or buffer.dtype != value.dtype:
            raise LayoutChanged
        return _copy_state_dict({"": value}, {"": buffer}, non_blocking=non_blocking, type_check=False)[""]
    if isinstance(value, dict):
        if not isinstance(buffer, dict) or buffer.keys() != value.keys():
            raise LayoutChanged
        return {key: _copy_into(item, buffer[key], non_blocking) for key, item in value.items()}
    if isinstance(value, list | tuple):
        if not isinstance(buffer, list | tuple) or len(buffer) != len(value):
            raise LayoutChanged
        items = [_copy_into(item, into, non_blocking) for item, into in zip(value, buffer, strict=True)]
        return tuple(items) if isinstance(value, tuple) else items
    if value is None or isinstance(value, int | float | str | bytes):
        return value
    return copy.deepcopy(value)


_PLAIN_TENSORS: frozenset[type] = frozenset({torch.Tensor, torch.nn.Parameter})
"""Tensor types copied as one tensor; any other (a ShardedTensor) goes through torch's helper."""


def _copy_tensor(into: torch.Tensor, source: torch.Tensor, non_blocking: bool) -> None:
    """One tensor into its buffer, refused unless shape and dtype match (`copy_` would broadcast or cast)."""
    if into.shape != source.shape or into.dtype != source.dtype:
        raise LayoutChanged
    into.copy_(source, non_blocking=non_blocking)


def local_bytes(value: Any) -> int:
    """Bytes of the tensors in a nested state dict as this rank holds them (a DTensor counts its shard): what
    staging copies, and what a rank's write of it holds, its metadata aside."""
    if isinstance(value, DTensor):
        return local_bytes(value.to_local())
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(local_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(local_bytes(v) for v in value)
    return 0
