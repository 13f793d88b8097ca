"""Bytes built only from the allowlist's globals and pickle's opcodes, random or mutated from real checkpoint
pickles, are loaded or refused with the unpickler's own error (`RefusedPickle`: a "corrupt" verdict), never
anything else; and the globals that would turn a few bytes into gigabytes accept only what pickle writes."""

import collections
import datetime
import decimal
import fractions
import io
import pickle
import random
import resource
import struct
import traceback
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path, PosixPath
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from ftrain.train.resume_load import load_failure
from ftrain.workers import unpickle
from ftrain.workers.dcp_reader import load_metadata
from ftrain.workers.unpickle import ForbiddenPickle, RefusedPickle, restricted_loads, torch_load
from tests.support.builders import write_checkpoint

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _global(module: str, name: str, stack: bool) -> bytes:
    """GLOBAL (protocols 0-3) or STACK_GLOBAL (4+) of `module.name`."""
    if stack:
        return _text(module) + _text(name) + b"\x93"
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _text(value: str) -> bytes:
    raw = value.encode("utf-8", "surrogatepass")
    return b"X" + struct.pack("<I", len(raw)) + raw


GLOBALS = [*sorted(unpickle._ALLOWED), ("torch", "float32"), ("torch", "bfloat16"), ("builtins", "eval")]
CODECS = [
    "latin1",
    "utf-8",
    "zzz",
    "rot13",
    "hex",
    "base64",
    "idna",
    "utf-16",
    "bz2",
    "zlib",
    "uu",
    "punycode",
]
constants = st.one_of(
    st.integers(-(2**31), 2**31 - 1).map(lambda n: b"J" + struct.pack("<i", n)),
    st.integers(0, 255).map(lambda n: b"K" + bytes([n])),
    st.binary(max_size=9).map(lambda raw: b"\x8a" + bytes([len(raw)]) + raw),  # LONG1
    st.floats().map(lambda x: b"G" + struct.pack(">d", x)),
    st.sampled_from([b"N", b"\x88", b"\x89", b")", b"]", b"}", b"\x8f"]),
    st.one_of(st.text(max_size=12), st.sampled_from(CODECS)).map(_text),
    st.binary(max_size=16).map(lambda raw: b"C" + bytes([len(raw)]) + raw),  # SHORT_BINBYTES
)
globals_ = st.tuples(st.sampled_from(GLOBALS), st.booleans()).map(lambda g: _global(*g[0], g[1]))
calls = st.builds(
    lambda f, args: f + b"(" + b"".join(args) + b"tR", globals_, st.lists(constants, max_size=4)
)
structure = st.one_of(
    st.sampled_from(
        [
            b"(",
            b"t",
            b"\x85",
            b"\x86",
            b"\x87",
            b"a",
            b"e",
            b"s",
            b"u",
            b"\x90",
            b"\x91",
            b"R",
            b"b",
            b"\x81",
            b"\x92",
            b"\x94",
            b"2",
            b"0",
            b"1",
            b"l",
            b"d",
            b".",
        ]
    ),
    st.integers(0, 8).map(lambda n: b"q" + bytes([n])),  # BINPUT
    st.integers(0, 8).map(lambda n: b"h" + bytes([n])),  # BINGET
    st.integers(0, 2**64 - 1).map(lambda n: b"\x95" + struct.pack("<Q", n)),  # FRAME
    st.integers(0, 2**64 - 1).map(lambda n: b"\x8e" + struct.pack("<Q", n)),  # BINBYTES8
)
random_pickles = st.builds(
    lambda proto, parts: b"\x80" + bytes([proto]) + b"".join(parts) + b".",
    st.integers(2, 5),
    st.lists(st.one_of(constants, globals_, calls, structure), max_size=40),
)


def _metadata() -> Metadata:
    chunk = ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([2, 3]))
    tensor = TensorStorageMetadata(TensorProperties(dtype=torch.bfloat16), torch.Size([2, 3]), [chunk])
    return Metadata(
        state_dict_metadata={"w": tensor}, storage_data={MetadataIndex("w", torch.Size([0, 0])): 1}
    )


def _seeds() -> list[bytes]:
    """Real checkpoint pickles (DCP metadata, RNG states, the containers state dicts hold) at protocols 2-5."""
    objects: list[Any] = [
        _metadata(),
        np.random.get_state(),
        random.getstate(),
        {
            "s": {1, 2},
            "f": frozenset([3]),
            "b": bytearray(b"x"),
            "o": OrderedDict(a=1),
            "p": PosixPath("/x"),
            "c": complex(1, 2),
            "sl": slice(1, 2),
            "a": np.arange(4, dtype=np.float32),
        },
        {  # what training loops keep: tests/unit/test_unpickle.py
            "f": np.float64(0.5),
            "i": np.int16(-3),
            "b": np.bool_(True),
            "c": np.complex64(1 - 2j),
            "M": np.datetime64("2026-12-04T16:30"),
            "m": np.timedelta64(3, "s"),
            "dt": datetime.datetime(
                2026, 12, 4, 16, 30, tzinfo=datetime.timezone(datetime.timedelta(hours=1))
            ),
            "d": datetime.date(2026, 12, 4),
            "t": datetime.time(16, 30, tzinfo=datetime.UTC),
            "td": datetime.timedelta(days=1, microseconds=3),
            "q": fractions.Fraction(22, 7),
            "dec": decimal.Decimal("-1.50E+7"),
            "dq": collections.deque([1.5, 2.5], maxlen=8),
        },
    ]
    return [pickle.dumps(obj, protocol=proto) for obj in objects for proto in range(2, 6)]


def _torch_save() -> bytes:
    """What DCP stores for a non-tensor item: `torch.save` bytes, the zip format."""
    buffer = io.BytesIO()
    torch.save({"t": torch.arange(6.0).reshape(2, 3), "lr": 0.1, "step": 3}, buffer)
    return buffer.getvalue()


def _mutate(seed: bytes, edits: list[tuple[float, int, int]]) -> bytes:
    """`seed` with bytes flipped, inserted or deleted (position as a fraction), then perhaps truncated."""
    data = bytearray(seed)
    for where, kind, byte in edits:
        at = int(where * len(data))
        if kind == 0 and at < len(data):
            data[at] = byte
        elif kind == 1:
            data.insert(at, byte)
        elif kind == 2:
            del data[at : at + 1]
        else:
            del data[at:]
    return bytes(data)


edits = st.lists(st.tuples(st.floats(0, 1), st.integers(0, 3), st.integers(0, 255)), min_size=1, max_size=4)
SEEDS = _seeds()
SAVE = _torch_save()


@pytest.fixture(scope="module", autouse=True)
def bounded_memory() -> Iterator[None]:
    """A few GiB of address space beyond what the process holds: an allocation the pickle asked for fails
    as a MemoryError the test reports, instead of taking the machine's memory."""
    with open("/proc/self/status") as status:
        held = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (held + 4 * 2**30, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _loaded_or_refused(load: Callable[[], Any]) -> None:
    """Loads, or raises RefusedPickle in one short line (any other exception fails the test)."""
    try:
        load()
    except RefusedPickle as exc:
        reason = str(exc)
    else:
        return
    assert "\n" not in reason and len(reason) < 400


@FUZZ
@given(random_pickles)
def test_random_pickles_from_the_allowlist_are_loaded_or_refused(data: bytes) -> None:
    _loaded_or_refused(lambda: restricted_loads(data, "a pickle"))


@FUZZ
@given(st.sampled_from(SEEDS), edits)
def test_mutated_checkpoint_pickles_are_loaded_or_refused(
    seed: bytes, changes: list[tuple[float, int, int]]
) -> None:
    _loaded_or_refused(lambda: restricted_loads(_mutate(seed, changes), "a pickle"))


@settings(max_examples=150, deadline=None)
@given(st.just(SAVE), edits)
def test_mutated_torch_saves_are_loaded_or_refused(
    seed: bytes, changes: list[tuple[float, int, int]]
) -> None:
    _loaded_or_refused(lambda: torch_load(io.BytesIO(_mutate(seed, changes)), "item app.x"))


def test_the_seeds_themselves_load() -> None:
    """The fuzz starts from what checkpoints really hold, and that still loads."""
    for seed in SEEDS:
        if b"_frombuffer" in seed:  # numpy's protocol-5 form, outside the allowlist (torch.save writes 2)
            with pytest.raises(ForbiddenPickle, match=r"numpy\._core\.numeric\._frombuffer"):
                restricted_loads(seed, "a pickle")
        else:
            assert repr(restricted_loads(seed, "a pickle")) == repr(pickle.loads(seed))
    assert torch.equal(torch_load(io.BytesIO(SAVE), "item")["t"], torch.arange(6.0).reshape(2, 3))


CODEC = _global("_codecs", "encode", stack=False)


def _dtype(spec: str) -> bytes:
    """`numpy.dtype(spec, False, True)`, as a numpy pickle makes one."""
    return _global("numpy", "dtype", False) + _text(spec) + b"\x89\x88\x87R"


SCALAR = _global("numpy._core.multiarray", "scalar", False)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (
            b"\x80\x02" + CODEC + _text("a") + _text("no-such-codec") + b"\x86R.",
            "LookupError: unknown encoding",
        ),
        (b"\x80\x02" + CODEC + _text("é") + _text("ascii") + _text("nope") + b"\x87R.", "LookupError"),
        (b"\x80\x04\x8e" + struct.pack("<Q", 2**60) + b"x.", "expected 1152921504606846976 bytes"),
        (
            b"\x80\x04\x95" + struct.pack("<Q", 2) + b"\x8e" + struct.pack("<Q", 0) + b".",
            "crosses the end of its frame",
        ),
        (b"\x80\x02" + _global("builtins", "bytearray", False) + b"J\x00\x00\x00\x40\x85R.", "bytearray(n)"),
        (
            b"\x80\x02"
            + _global("numpy._core.multiarray", "_reconstruct", False)
            + _global("numpy", "ndarray", False)
            + b"J\x00\x00\x00\x40\x85"
            + _text("O")
            + b"\x87R.",
            "_reconstruct(ndarray, (0,), dtype)",
        ),
        (b"\x80\x02" + _global("numpy", "ndarray", False) + b"J\x00\x00\x00\x40\x85\x85R.", "TypeError"),
        (b"\x80\x02" + SCALAR + _dtype("V2000000000") + b"\x85R.", "from exactly its dtype's bytes"),  # 2 GB
        (b"\x80\x02" + SCALAR + _dtype("f8") + b"C\x07" + bytes(7) + b"\x86R.", "from exactly its dtype's"),
        (b"\x80\x02" + SCALAR + _dtype("O") + b"N\x86R.", "from exactly its dtype's bytes"),
        (b"\x80\x02" + SCALAR + _dtype("U1") + b"C\x04\xff\xff\xff\xff\x86R.", "from exactly its dtype's"),
        (  # parsed, a power of ten with a billion digits: minutes and gigabytes
            b"\x80\x02" + _global("fractions", "Fraction", False) + _text("1e999999999") + b"\x85R.",
            "Fraction(numerator, denominator)",
        ),
        (b"\x80\x02" + _global("fractions", "Fraction", False) + b"K\x01K\x00\x86R.", "ZeroDivisionError"),
        (
            b"\x80\x02" + _global("datetime", "timedelta", False) + b"\x8a\x05\x00\xe4\x0bT\x02\x85R.",
            "Overflow",
        ),
        (
            b"\x80\x02" + _global("decimal", "Decimal", False) + _text("1e9999999999999999999") + b"\x85R.",
            "Invalid",
        ),
        (b"\x80\x02" + _global("collections", "deque", False) + b")J\xff\xff\xff\xff\x86R.", "maxlen"),
    ],
)
def test_what_allowed_globals_raise_or_would_allocate_is_a_refusal_naming_it(data: bytes, why: str) -> None:
    with pytest.raises(pickle.UnpicklingError, match=r"^RNG state does not unpickle: ") as caught:
        restricted_loads(data, "RNG state")
    assert why in str(caught.value)


def test_a_metadata_that_raises_while_loading_is_a_corrupt_verdict(tmp_path: Path) -> None:
    raw = b"\x80\x02" + CODEC + _text("a") + _text("no-such-codec") + b"\x86R."
    sources = [(".metadata", raw), ("__0_0.distcp", b"")]
    written = write_checkpoint(tmp_path / "storage", run_id="r", step=10, epoch=0, shards=1, sources=sources)
    assert load_metadata(written.path, written.manifest.files) == (
        "`.metadata` does not unpickle: LookupError: unknown encoding: no-such-codec"
    )


def test_an_item_that_raises_while_loading_is_a_corrupt_verdict_on_every_rank(tmp_path: Path) -> None:
    """Non-tensor items load inside DCP, which hands every rank each rank's exception."""
    broken = io.BytesIO(b"not a zip and not a pickle")
    with pytest.raises(RefusedPickle) as caught:
        torch_load(broken, "item app.x")
    failed = CheckpointException("read", {0: (caught.value, traceback.StackSummary())})
    assert load_failure(tmp_path, failed) == str(caught.value)
    assert str(caught.value).startswith("item app.x does not unpickle: UnpicklingError: ")


HUGE_MEMO = b"\x80\x02K\x01r" + struct.pack("<I", 2**31) + b"."
"""BININT1 1, LONG_BINPUT 2**31, STOP: the C unpickler sizes its memo to the index (16 GiB of pointers). The
fuzz found it twice by changing one byte of a real checkpoint pickle's LONG_BINPUT."""


def test_a_memo_index_no_pickle_of_its_size_can_reach_is_corrupt_not_a_memory_error() -> None:
    with pytest.raises(
        RefusedPickle, match=r"LONG_BINPUT at byte 4 stores memo entry 2147483648, beyond any"
    ):
        restricted_loads(HUGE_MEMO, "a pickle")
    with pytest.raises(
        RefusedPickle, match=r"LONG_BINPUT at byte 4 stores memo entry 2147483648, beyond any"
    ):
        torch_load(io.BytesIO(HUGE_MEMO), "item")  # not a zip: torch's legacy reader, the same unpickler
