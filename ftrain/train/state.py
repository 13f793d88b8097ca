"""Everything that shapes a training trajectory, as one DCP state dict: exact resume needs all of it.

Model and optimizer go through `get_state_dict`/`set_state_dict` (sharded DTensors, no gather); every other
stateful object the script names (an LR scheduler, the data position, EMA weights, a GradScaler) and the step
are replicated; the RNG states (python, numpy, torch, CUDA) differ
per rank and live under a per-rank key, so each rank saves and restores its own. The python and numpy states
are stored as plain numbers (tuples, lists): loading them runs nothing. Checkpoints written before kept them
as pickled bytes; those still load, through the allowlisted unpickler.
"""

import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

import numpy as np
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from ftrain.workers.unpickle import restricted_loads

if TYPE_CHECKING:
    from ftrain.train.loaders import DataSource


class Resumable(Protocol):
    """Anything with a state dict: an LR scheduler, a resumable data loader, EMA weights, a GradScaler."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


RESERVED_KEYS: Final = ("model", "optim", "progress")
"""Keys of the saved state ftrain fills itself (with `rng/<rank>`): no named state may take them."""


def resumable(value: object) -> bool:
    """Whether `value` can save and restore its state."""
    return callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))


def rng_state() -> dict[str, Any]:
    """This process's random number generators, as numbers and tensors only."""
    kind, key, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": random.getstate(),  # (version, 625 ints, gauss or None)
        "numpy": (kind, [int(k) for k in key], int(pos), int(has_gauss), float(gauss)),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` captured (or, from an older checkpoint, its pickled bytes)."""
    python, numpy = (
        restricted_loads(s, "RNG state") if isinstance(s, bytes) else s
        for s in (state["python"], state["numpy"])
    )
    random.setstate(_tuples(python))
    kind, key, pos, has_gauss, gauss = numpy
    np.random.set_state((kind, np.asarray(key, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _tuples(value: Any) -> Any:
    """`value` with its lists made tuples (`random.setstate` takes tuples only)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list | tuple) else value


class TrainState(Stateful):
    """The full training state of one rank; `step`/`epoch` are the position the state corresponds to.

    The model and the optimizer (either may be absent) are saved sharded, as DCP's `get_state_dict` gives
    them (plain, DDP and FSDP2 modules alike); every named state is saved as its own `state_dict()` gives
    it, under its name."""

    def __init__(
        self,
        model: nn.Module | None,
        optimizer: torch.optim.Optimizer | None,
        states: Mapping[str, Resumable],
        rank: int,
    ) -> None:
        for name, value in states.items():
            if name in RESERVED_KEYS or name.startswith("rng/") or not name:
                raise ValueError(
                    f"states[{name!r}]: the name is ftrain's own ({', '.join(RESERVED_KEYS)}, rng/)"
                )
            if not resumable(value):
                raise ValueError(
                    f"states[{name!r}]: a {type(value).__name__} has no state_dict()/load_state_dict()"
                )
        self.model = model
        self.optimizer = optimizer
        self.states = dict(states)
        self.rank = rank
        self.step = 0
        self.epoch = 0
        self.restore_rng = True
        self.data: DataSource | None = None
        """The loader as the checkpoint manager saves it (None: none was given)."""

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {name: value.state_dict() for name, value in self.states.items()}
        if self.model is not None:
            optimizers = () if self.optimizer is None else (self.optimizer,)
            state["model"], optim_sd = get_state_dict(self.model, optimizers)
            if self.optimizer is not None:
                state["optim"] = optim_sd
        state["progress"] = {"step": self.step, "epoch": self.epoch}
        if self.restore_rng:
            state[f"rng/{self.rank}"] = rng_state()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.model is not None:
            optimizers = () if self.optimizer is None else (self.optimizer,)
            set_state_dict(
                self.model,
                optimizers,
                model_state_dict=state_dict["model"],
                optim_state_dict=state_dict.get("optim", {}),
            )
        for name, value in self.states.items():
            value.load_state_dict(state_dict[name])
        self.step = int(state_dict["progress"]["step"])
        self.epoch = int(state_dict["progress"]["epoch"])
        if self.restore_rng:
            set_rng_state(state_dict[f"rng/{self.rank}"])
