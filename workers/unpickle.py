"""The one way ftrain unpickles checkpoint bytes: an allowlisted unpickler, never `pickle.loads`.

A pickle runs whatever its globals name, so a checkpoint that verified against its manifest could still run
code if the manifest's writer was hostile. DCP's `.metadata`, DCP's non-tensor items (`torch.save` bytes)
and RNG states of older checkpoints load only through here; a global outside the allowlist is refused with
its name. The allowlist is what real checkpoints reference (DCP's metadata classes, tensor rebuilding,
dtypes, containers, numpy arrays); a training script adds its own types with `allow_pickled`.
"""

import _compat_pickle
import io
import pickle
from types import SimpleNamespace
from typing import IO, Any

import torch

_ALLOWED: set[tuple[str, str]] = {
    *(
        ("torch.distributed.checkpoint.metadata", name)
        for name in (
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorProperties",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        )
    ),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("torch._utils", "_rebuild_tensor_v2"),
    ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"),
    ("_codecs", "encode"),  # how protocol 2 (torch.save's) writes bytes
    *(("builtins", name) for name in ("set", "frozenset", "bytearray", "complex", "slice")),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "_reconstruct"),  # numpy 1 pickles
}
_DTYPES = frozenset(name for name in dir(torch) if isinstance(getattr(torch, name), torch.dtype))


class ForbiddenPickle(pickle.UnpicklingError):
    """A pickle in a checkpoint names a global outside the allowlist: the checkpoint is refused, unrun."""


def allow_pickled(*objects: type | Any) -> None:
    """Let checkpoints name these classes or functions (a training script's own state types). Call before
    `CheckpointManager.load`; each must be safe to call with whatever arguments a hostile pickle gives it."""
    for obj in objects:
        _ALLOWED.add((obj.__module__, obj.__qualname__))


def allowed(module: str, name: str) -> bool:
    """Whether a pickle may name `module.name`."""
    return (module, name) in _ALLOWED or (module == "torch" and name in _DTYPES)


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only allowlisted globals; `what` names the bytes in its refusal."""

    what = "a pickle"

    def find_class(self, module: str, name: str) -> Any:
        # protocol 2 (torch.save's) writes Python 2 names, which pickle maps back: judge what it will load
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        if not allowed(module, name):
            raise ForbiddenPickle(f"{self.what} names {module}.{name}, which is not allowed")
        return super().find_class(module, name)


def restricted_load(stream: IO[bytes], what: str) -> Any:
    """Unpickle one object from `stream` through the allowlist. Raises ForbiddenPickle."""
    unpickler = RestrictedUnpickler(stream)
    unpickler.what = what
    return unpickler.load()


def restricted_loads(data: bytes, what: str) -> Any:
    """Unpickle `data` through the allowlist. Raises ForbiddenPickle."""
    return restricted_load(io.BytesIO(data), what)


def torch_load(stream: IO[bytes], what: str) -> Any:
    """`torch.load` of `torch.save` bytes with its unpickler bound to the allowlist (torch subclasses the
    given module's Unpickler for storages; every other global still passes `find_class` here)."""

    class Bound(RestrictedUnpickler):
        pass

    Bound.what = what
    module = SimpleNamespace(
        __name__="ftrain_restricted_pickle",
        Unpickler=Bound,
        load=lambda f, **kwargs: Bound(f, **kwargs).load(),
    )
    return torch.load(stream, map_location="cpu", weights_only=False, pickle_module=module)
