"""Stage a state dict into reusable, preallocated host buffers: the only stall an async save puts on training.

The buffers are allocated at the first save and reused (`copy_` into preallocated memory runs at memcpy speed;
a fresh `clone()` runs 4-6x slower here), pinned when the state lives on a GPU so the copy is a DMA. They are
torch's own staging helpers, the ones `dcp.async_save` uses, so DTensor shards and pinned memory are handled as
torch handles them.
"""

from typing import Any

import torch
from torch.distributed._state_dict_utils import CompanionMismatch, _copy_state_dict, _create_cpu_state_dict


class StagingBuffers:
    """Host copies of a state dict, rewritten in place at every save."""

    def __init__(self) -> None:
        self._cache: dict[str, Any] | None = None
        self.pin = torch.cuda.is_available()

    def stage(self, state: dict[str, Any]) -> dict[str, Any]:
        """Copy `state` into the buffers; returns the staged copy (valid until the next `stage`)."""
        if self._cache is not None:
            try:
                return self._copy(state, self._cache)
            except CompanionMismatch:
                self._cache = None  # the state's shape changed (e.g. optimizer state appeared): reallocate
        self._cache = _create_cpu_state_dict(state, pin_memory=self.pin)
        return self._copy(state, self._cache)

    def _copy(self, state: dict[str, Any], cache: dict[str, Any]) -> dict[str, Any]:
        staged: dict[str, Any] = _copy_state_dict(state, cache, non_blocking=self.pin)
        if self.pin:
            torch.cuda.synchronize()
        return staged
