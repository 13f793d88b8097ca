"""The model's weights (and, asked for, the optimizer's state) as `torch.save` files. Unlike safetensors,
a pickle is written from one object: each file's contents are in memory at once."""

from pathlib import Path
from typing import Any, Final

import torch
from torch.distributed.checkpoint._traverse import set_element

from ftrain.errors import Refused
from ftrain.export import tensors
from ftrain.export.source import VerifiedCheckpoint
from ftrain.export.written import Written, write_new

MODEL_FILE: Final = "model.pt"
OPTIMIZER_FILE: Final = "optimizer.pt"


def write_torch(source: VerifiedCheckpoint, out: Path, with_optimizer: bool) -> list[Written]:
    """`model.pt`: the model's `state_dict()`; with `with_optimizer`, `optimizer.pt`: the optimizer's state
    keyed by parameter name, as `torch.distributed.checkpoint.state_dict.get_optimizer_state_dict` gives it
    (`set_optimizer_state_dict` loads it)."""
    model = tensors.items(source, tensors.MODEL)
    if not model:
        raise Refused("the checkpoint holds no model weights (nothing saved under app.model)")
    written = [_save(out / MODEL_FILE, _nested(source, model))]
    if with_optimizer:
        optimizer = tensors.items(source, tensors.OPTIMIZER)
        if not optimizer:
            raise Refused("the checkpoint holds no optimizer state (nothing saved under app.optim)")
        written.append(_save(out / OPTIMIZER_FILE, _nested(source, optimizer)))
    return written


def _nested(source: VerifiedCheckpoint, items: list[tensors.Item]) -> dict[str, Any]:
    """The items' values, loaded a batch at a time, placed at their paths (a list where a path says so)."""
    root: dict[str, Any] = {}
    for batch in tensors.batches(items):
        loaded = tensors.load(source, batch)
        for item in batch:
            set_element(root, item.path, loaded.pop(item.key))
    return root


def _save(path: Path, value: dict[str, Any]) -> Written:
    return write_new(path, lambda f: torch.save(value, f))
