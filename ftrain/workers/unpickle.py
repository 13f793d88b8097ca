"""The one way ftrain unpickles checkpoint bytes: an allowlisted unpickler, never `pickle.loads`.

A pickle runs whatever its globals name, so a checkpoint that verified against its manifest could still run
code if the manifest's writer was hostile. DCP's `.metadata`, DCP's non-tensor items (`torch.save` bytes)
and RNG states of older checkpoints load only through here; a global outside the allowlist is refused with
its name. The allowlist is what real checkpoints reference (DCP's metadata classes, tensor rebuilding,
dtypes, containers, numpy arrays) and the values training loops keep in a state dict (NumPy scalars,
`datetime`'s types, `Fraction`, `Decimal`, `deque`); a training script adds its own types with
`allow_pickled`. A save checks its state against the same allowlist (`train.save_check`), so what would be
refused here is refused before it is written.

Whatever else goes wrong while loading (a malformed stream, an allowed global called with arguments it
refuses: an unknown codec, a tensor outside its storage) is a `CorruptPickle` naming the exception, so the
checkpoint is judged corrupt rather than crashing the resume. Not a MemoryError, unless the stream itself
asks for more bytes than it holds: a shortage while loading a sound checkpoint is no verdict on it. The
globals that could turn a few bytes into gigabytes, or minutes of work, accept only the forms pickle writes
(never `bytearray(n)`, a numpy array of a given shape, a numpy scalar of a dtype larger than its bytes, a
`Fraction` from the string `'1e999999999'`, a billion-digit power of ten); every other allowed global builds
its value from the pickle's own bytes, in time proportional to them, and runs nothing.
"""

import _compat_pickle
import fractions
import io
import pickle
import pickletools
from collections.abc import Callable
from types import SimpleNamespace
from typing import IO, Any, Final

import numpy
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
    ("collections", "deque"),
    *(("datetime", name) for name in ("datetime", "date", "time", "timedelta", "timezone")),
    ("fractions", "Fraction"),
    ("decimal", "Decimal"),
    ("pathlib", "PosixPath"),
    ("_codecs", "encode"),  # how protocol 2 (torch.save's) writes bytes
    *(("builtins", name) for name in ("set", "frozenset", "bytearray", "complex", "slice")),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "_reconstruct"),  # numpy 1 pickles
    ("numpy._core.multiarray", "scalar"),  # a numpy scalar: numpy.float64(0.5), numpy.int64(3)
    ("numpy.core.multiarray", "scalar"),
}
_NUMPY_RECONSTRUCT: Final[Callable[..., Any]] = numpy.empty(0).__reduce__()[0]  # type: ignore[assignment]
"""The function numpy pickles an array with (`numpy._core.multiarray._reconstruct`; `numpy.core` in 1.x)."""
_NUMPY_SCALAR: Final[Callable[..., Any]] = numpy.float64(0).__reduce__()[0]  # type: ignore[assignment]
"""The function numpy pickles a scalar with (`numpy._core.multiarray.scalar`)."""
SCALAR_KINDS: Final = "biufcmM"
"""The numpy scalars a checkpoint may hold: bool, integers, floats, complex, datetime64 and timedelta64 (not
strings, whose bytes need not be valid text, nor structured or object values)."""
_DTYPES = frozenset(name for name in dir(torch) if isinstance(getattr(torch, name), torch.dtype))
MAX_REASON: Final = 200
"""The longest exception text a refusal quotes (it becomes a verdict in the log)."""


class RefusedPickle(pickle.UnpicklingError):
    """Checkpoint bytes the unpickler will not load: the checkpoint is refused as corrupt, never run."""


class ForbiddenPickle(RefusedPickle):
    """A pickle in a checkpoint names a global outside the allowlist: the checkpoint is refused, unrun.
    `name` is the global, `module.qualname`."""

    def __init__(self, message: str, name: str = "") -> None:
        super().__init__(message)  # the message alone: DCP pickles a rank's exception to the others
        self.name = name


class CorruptPickle(RefusedPickle):
    """Bytes that do not load through the allowlist: malformed, or allowed globals that refused their
    arguments. The message names the exception."""


class _NdarrayType:
    """What `numpy.ndarray` resolves to: the type a pickle hands `_reconstruct`, never called (a call would
    allocate whatever shape the pickle names)."""


_NDARRAY: Final = _NdarrayType()


def _bytearray(*args: Any) -> bytearray:
    """`bytearray` as pickles write it (from bytes, or a string and its encoding), never `bytearray(n)`."""
    if args and isinstance(args[0], int):
        raise ValueError("bytearray(n) is not how a pickle writes a bytearray")
    return bytearray(*args)


def _reconstruct(subtype: Any, shape: Any, dtype: Any) -> numpy.ndarray[Any, Any]:
    """numpy's `_reconstruct` as numpy pickles an array: an empty ndarray, filled by BUILD from the pickle's
    own bytes (any other shape would be allocated here, from nothing)."""
    if subtype is not _NDARRAY or shape != (0,):
        raise ValueError("an array is pickled as _reconstruct(ndarray, (0,), dtype)")
    return _NUMPY_RECONSTRUCT(numpy.ndarray, (0,), dtype)  # type: ignore[no-any-return]


def _scalar(*args: Any) -> Any:
    """numpy's `scalar` as numpy pickles a number: a plain numeric dtype and exactly its bytes (no bytes would
    allocate the dtype's size, whatever it is; an object dtype returns whatever it is handed)."""
    dtype, data = args if len(args) == 2 else (None, None)
    if not (
        isinstance(dtype, numpy.dtype)
        and dtype.kind in SCALAR_KINDS
        and dtype.fields is None
        and isinstance(data, bytes)
        and len(data) == dtype.itemsize
    ):
        raise ValueError(
            "a numpy scalar loads as a number (bool, integer, float, complex, datetime64, timedelta64) "
            "from exactly its dtype's bytes"
        )
    return _NUMPY_SCALAR(*args)


def _fraction(*args: Any) -> fractions.Fraction:
    """`Fraction` as it pickles itself, from its numerator and denominator: never from a string, where
    `'1e999999999'` would take minutes and gigabytes to build its power of ten."""
    if len(args) != 2 or not all(isinstance(a, int) for a in args):
        raise ValueError("a Fraction is pickled as Fraction(numerator, denominator)")
    return fractions.Fraction(*args)


_BOUNDED: Final[dict[tuple[str, str], Any]] = {
    ("builtins", "bytearray"): _bytearray,
    ("numpy", "ndarray"): _NDARRAY,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "scalar"): _scalar,
    ("numpy.core.multiarray", "scalar"): _scalar,
    ("fractions", "Fraction"): _fraction,
}
"""Allowed globals a pickle gets in a bounded form."""


def _corrupt(what: str, exc: BaseException) -> CorruptPickle:
    reason = " ".join(f"{type(exc).__name__}: {exc}".split())
    return CorruptPickle(f"{what} does not unpickle: {reason[:MAX_REASON]}")


_MEMO_PUTS: Final = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})


def _overrun(file: IO[bytes]) -> ValueError | None:
    """Why an in-memory pickle's stream is malformed: a length past its end, an unknown opcode, an opcode
    across the end of its frame, a memo index no pickle of its size can reach (the C unpickler answers those
    with a MemoryError); None when it is sound or not in memory."""
    if not isinstance(file, io.BytesIO):
        return None
    try:
        ops = list(pickletools.genops(file.getvalue()))
    except ValueError as exc:
        return exc
    starts = [pos or 0 for _, _, pos in ops]  # bytes always have positions
    frame_end, size = 0, len(file.getvalue())
    for (op, arg, _), pos, end in zip(ops, starts, [*starts[1:], starts[-1] + 1], strict=True):
        if pos < frame_end < end:
            return ValueError(f"{op.name} at byte {pos} crosses the end of its frame")
        if op.name in _MEMO_PUTS and int(arg or 0) > size:  # the C unpickler sizes its memo to the index
            return ValueError(
                f"{op.name} at byte {pos} stores memo entry {arg}, beyond any pickle of {size} bytes"
            )
        if op.name == "FRAME":
            frame_end = end + int(arg or 0)
    return None


def allow_pickled(*objects: type | Any) -> None:
    """Let checkpoints name these classes or functions (a training script's own state types). Call before
    the first save (which checks its state against this same list) and before `CheckpointManager.load`, in
    every process; each must be safe to call, and its `__setstate__` to run, with whatever arguments a hostile
    pickle gives it: a plain data class of numbers and strings is, a class whose constructor opens files or
    works in proportion to a number it is handed is not."""
    for obj in objects:
        _ALLOWED.add((obj.__module__, obj.__qualname__))


def allowed(module: str, name: str) -> bool:
    """Whether a pickle may name `module.name`."""
    return (module, name) in _ALLOWED or (module == "torch" and name in _DTYPES)


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only allowlisted globals; `what` names the bytes in its refusal."""

    what = "a pickle"

    def __init__(self, file: IO[bytes], **kwargs: Any) -> None:
        super().__init__(file, **kwargs)
        self.file = file

    def find_class(self, module: str, name: str) -> Any:
        # protocol 2 (torch.save's) writes Python 2 names, which pickle maps back: judge what it will load
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        if not allowed(module, name):
            refused = f"{module}.{name}"
            raise ForbiddenPickle(f"{self.what} names {refused}, which is not allowed", refused)
        return _BOUNDED.get((module, name)) or super().find_class(module, name)

    def load(self) -> Any:
        """The one object; whatever the bytes make go wrong is a RefusedPickle naming it."""
        try:
            return super().load()
        except (RefusedPickle, OSError):  # OSError: the stream's own read, no verdict on its bytes
            raise
        except MemoryError as exc:
            if (malformed := _overrun(self.file)) is None:
                raise
            raise _corrupt(self.what, malformed) from exc
        except Exception as exc:  # an allowed global may raise anything; KeyboardInterrupt is no Exception
            raise _corrupt(self.what, exc) from exc


def restricted_load(stream: IO[bytes], what: str) -> Any:
    """Unpickle one object from `stream` through the allowlist. Raises RefusedPickle."""
    unpickler = RestrictedUnpickler(stream)
    unpickler.what = what
    return unpickler.load()


def restricted_loads(data: bytes, what: str) -> Any:
    """Unpickle `data` through the allowlist. Raises RefusedPickle."""
    return restricted_load(io.BytesIO(data), what)


def torch_load(stream: IO[bytes], what: str) -> Any:
    """`torch.load` of `torch.save` bytes with its unpickler bound to the allowlist (torch subclasses the
    given module's Unpickler for storages; every other global still passes `find_class` here). Raises
    RefusedPickle, also for a malformed archive around the pickle."""

    class Bound(RestrictedUnpickler):
        pass

    Bound.what = what
    module = SimpleNamespace(
        __name__="ftrain_restricted_pickle",
        Unpickler=Bound,
        load=lambda f, **kwargs: Bound(f, **kwargs).load(),
    )
    try:
        return torch.load(stream, map_location="cpu", weights_only=False, pickle_module=module)
    except (RefusedPickle, MemoryError, OSError):
        raise
    except Exception as exc:
        raise _corrupt(what, exc) from exc
