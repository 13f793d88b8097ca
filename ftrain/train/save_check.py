"""Refusing at save time what a resume would refuse: a state that saves but can never be loaded.

DCP writes every non-tensor item of the state as `torch.save` bytes, and a resume loads them only through the
allowlisted unpickler (`workers.unpickle`). A `states` object whose `state_dict()` holds a value the allowlist
does not know (a class of the script's own) used to save without a word and make every checkpoint of the run
corrupt at the next start. Here each such item takes the same round trip before anything is written: pickled
as DCP pickles it, loaded back through the same allowlist, so one place decides. Every rank checks its own
state and all of them learn whether any refused (one small all-reduce per save), so every rank raises the
same `UnresumableState` together and none waits in the save's collectives for the others. Plain data (numbers,
strings, None, and lists, tuples and dicts of them) pickles to no global at all, so any unpickler loads it: it
skips the round trip, which cost an async save's stall ~9 ms on the reference state (docs/benchmarks.md).
"""

import io
from typing import Any, Final

import torch
import torch.distributed as dist
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint._traverse import OBJ_PATH

from ftrain.errors import UnresumableState as UnresumableState
from ftrain.train.agreement import lowest_refusal
from ftrain.workers.unpickle import MAX_REASON, ForbiddenPickle, RefusedPickle, torch_load

PLAIN_SCALARS: Final = frozenset({int, float, bool, str, type(None)})
"""Types whose pickles (protocol 2, torch.save's) name no global: exactly these, not subclasses (a NumPy
float is a float), and not bytes (protocol 2 writes them through `_codecs.encode`)."""
PLAIN_DEPTH: Final = 8
"""How deep in nested containers a value is still judged plain; a deeper one takes the round trip."""


def plain(value: object, depth: int = PLAIN_DEPTH) -> bool:
    """Whether `value` is plain data: a scalar of PLAIN_SCALARS, or a list, tuple or dict (exactly those
    types) of plain data, at most `depth` containers deep. Its pickle names no global, so it always loads."""
    kind = type(value)
    if kind in PLAIN_SCALARS:
        return True
    if depth == 0:
        return False
    if isinstance(value, list | tuple) and kind in (list, tuple):
        return all(plain(item, depth - 1) for item in value)
    if isinstance(value, dict) and kind is dict:
        return all(plain(key, 0) and plain(item, depth - 1) for key, item in value.items())
    return False


def refusal(state: dict[str, Any]) -> str | None:
    """Why the first non-tensor item of `state` (a `TrainState.state_dict()`) would not load at resume, in
    one line naming its key path and type and what to do; None when every item would load."""
    flat, paths = flatten_state_dict(state)
    for fqn, value in flat.items():
        if isinstance(value, torch.Tensor) or hasattr(value, "__create_write_items__"):
            continue  # DCP writes it as a tensor (DTensor, ShardedTensor alike), and loads it as one
        if plain(value):
            continue
        what = f"state item {_path(paths[fqn])} (a {_type(value)})"
        buffer = io.BytesIO()
        try:
            torch.save(value, buffer)  # as DCP's planner turns a non-tensor item into bytes
        except Exception as exc:  # pickling runs the value's own code: anything can come out of it
            reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:MAX_REASON]
            return f"{what} cannot be pickled: {reason}"
        buffer.seek(0)
        try:
            torch_load(buffer, what)
        except ForbiddenPickle as exc:
            return (
                f"{exc}, so no resume could load it: keep plain values in state_dict() (tensors, "
                "numbers, strings, containers, NumPy numbers and arrays, datetimes), or allow the type "
                f"before the first save with ftrain.train.checkpointing.allow_pickled({exc.name}) if "
                "loading it runs no code"
            )
        except RefusedPickle as exc:
            return f"{exc}, so no resume could load it"
    return None


def check_resumable(state: dict[str, Any], step: int, group: dist.ProcessGroup) -> None:
    """Every rank of `group`, before saving `state` as `step`: raise UnresumableState on every rank when any
    rank's state holds an item a resume would refuse (the lowest such rank's reason)."""
    refused = lowest_refusal(refusal(state), group)
    if refused is None:
        return
    rank, reason = refused
    where = "" if dist.get_world_size(group) == 1 else f" (rank {rank})"
    raise UnresumableState(f"checkpoint at step {step} not saved{where}: {reason}")


def _path(path: OBJ_PATH) -> str:
    """`best['loss']`: the named state, then each key (or list index) inside what its state_dict() gave."""
    return str(path[0]) + "".join(f"[{key!r}]" for key in path[1:])


def _type(value: object) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
