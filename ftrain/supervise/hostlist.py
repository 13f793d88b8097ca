"""Which hosts a job runs on: Slurm hostlists, PBS nodefiles, and the resolved allocation.

Pure functions (the only I/O is reading a PBS nodefile) so the control plane can resolve
an allocation without torch and the parsing can be tested exhaustively.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Final

import msgspec

__all__ = [
    "MAX_HOSTS",
    "SOURCES",
    "Allocation",
    "HostlistError",
    "compress_hostlist",
    "expand_hostlist",
    "is_valid_hostname",
    "read_pbs_nodefile",
    "resolve_allocation",
]

MAX_HOSTS: Final = 1_000_000
"""Refuse expansions above this: a typo like ``n[1-99999999]`` must not eat all memory."""

SOURCES: Final = ("nodelist", "slurm", "pbs", "localhost")

_HOSTNAME_RE: Final = re.compile(r"[A-Za-z0-9._-]+")
_RANGE_RE: Final = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_LAST_DIGITS_RE: Final = re.compile(r"(.*?)([0-9]+)([^0-9]*)")


class HostlistError(ValueError):
    """A hostlist, nodefile or allocation is unusable; the message is one CLI error line."""


def is_valid_hostname(name: str) -> bool:
    """True when ``name`` is non-empty and only letters, digits, ``-``, ``.``, ``_``."""
    return _HOSTNAME_RE.fullmatch(name) is not None


# --------------------------------------------------------------------------- expand

# One parsed item: literal text or a bracket group, the latter as (lo, hi, width) ranges.
_Range = tuple[int, int, int]
_Segment = str | tuple[_Range, ...]


def expand_hostlist(expr: str) -> list[str]:
    """Expand Slurm hostlist syntax (``node[07-08,10],gpu-a[1-3]``) into host names.

    Order and duplicates are kept as written, as Slurm does. A range is zero-padded to the
    width of its lower bound (``n[098-100]`` -> n098 n099 n100, ``n[8-10]`` -> n8 n9 n10).
    Several bracket groups in one item form a cartesian product, the first group varying
    slowest. Surrounding whitespace is ignored; anything malformed raises HostlistError.
    """
    text = expr.strip()
    if not text:
        raise HostlistError("empty hostlist")
    space = next((pos for pos, char in enumerate(text) if char.isspace()), None)
    if space is not None:
        raise HostlistError(f"whitespace at position {space} in hostlist {text!r}")
    items = [_parse_item(item, text) for item in _split_items(text)]
    _check_total(items, text)
    return [host for item in items for host in _expand_item(item)]


def _split_items(text: str) -> list[str]:
    """Split on commas outside brackets, rejecting unbalanced or nested brackets."""
    items: list[str] = []
    depth = 0
    start = 0
    for pos, char in enumerate(text):
        if char == "[":
            if depth:
                raise HostlistError(f"nested '[' at position {pos} in hostlist {text!r}")
            depth = 1
        elif char == "]":
            if not depth:
                raise HostlistError(f"unbalanced ']' at position {pos} in hostlist {text!r}")
            depth = 0
        elif char == "," and not depth:
            items.append(text[start:pos])
            start = pos + 1
    if depth:
        raise HostlistError(f"unbalanced '[' (missing ']') in hostlist {text!r}")
    items.append(text[start:])
    for index, item in enumerate(items):
        if not item:
            raise HostlistError(f"empty item #{index + 1} in hostlist {text!r}")
    return items


def _parse_item(item: str, text: str) -> tuple[_Segment, ...]:
    """Cut one item into literal and bracket segments (brackets are known balanced)."""
    segments: list[_Segment] = []
    for piece in re.split(r"(\[[^\]]*\])", item):
        if piece.startswith("["):
            segments.append(_parse_group(piece[1:-1], item))
        elif piece:
            _check_literal(piece, item, text)
            segments.append(piece)
    return tuple(segments)


def _check_literal(piece: str, item: str, text: str) -> None:
    """Literal parts of a name may only use hostname characters (no whitespace)."""
    if not is_valid_hostname(piece):
        bad = next(char for char in piece if not is_valid_hostname(char))
        raise HostlistError(f"invalid character {bad!r} in host {item!r} of hostlist {text!r}")


def _parse_group(body: str, item: str) -> tuple[_Range, ...]:
    """Parse the inside of ``[...]``: comma-separated numbers and ``lo-hi`` ranges."""
    if not body:
        raise HostlistError(f"empty brackets in {item!r}")
    ranges: list[_Range] = []
    for part in body.split(","):
        if not part:
            raise HostlistError(f"empty range element in {item!r}")
        match = _RANGE_RE.fullmatch(part)
        if match is None:
            raise HostlistError(f"non-numeric range {part!r} in {item!r}")
        lo_text, hi_text = match.group(1), match.group(2)
        lo = int(lo_text)
        hi = lo if hi_text is None else int(hi_text)
        if hi < lo:
            raise HostlistError(f"reversed range {part!r} in {item!r}")
        ranges.append((lo, hi, len(lo_text)))
    return tuple(ranges)


def _item_size(item: tuple[_Segment, ...]) -> int:
    """Number of hosts an item expands to, computed without expanding it."""
    return math.prod(sum(hi - lo + 1 for lo, hi, _ in seg) for seg in item if not isinstance(seg, str))


def _check_total(items: list[tuple[_Segment, ...]], text: str) -> None:
    total = 0
    for item in items:
        total += _item_size(item)
        if total > MAX_HOSTS:
            raise HostlistError(f"hostlist {text!r} expands to more than {MAX_HOSTS:,} hosts")


def _group_values(ranges: tuple[_Range, ...]) -> list[str]:
    return [str(n).zfill(width) for lo, hi, width in ranges for n in range(lo, hi + 1)]


def _expand_item(item: tuple[_Segment, ...]) -> Iterator[str]:
    choices = [(seg,) if isinstance(seg, str) else _group_values(seg) for seg in item]
    return ("".join(parts) for parts in itertools.product(*choices))


# --------------------------------------------------------------------------- compress


def compress_hostlist(hosts: Sequence[str]) -> str:
    """Write hosts back in hostlist syntax for display, e.g. ``node[07-08,10],gpu-a[1-3]``.

    Order-preserving, never sorts or de-duplicates: runs of *adjacent* hosts that differ
    only in their last digit run share one bracket group, and ascending consecutive numbers
    in it become ``lo-hi`` when their padding allows. Hence, for every sequence of valid
    host names (see ``is_valid_hostname``; any order, duplicates allowed),
    ``expand_hostlist(compress_hostlist(hosts)) == list(hosts)``. An empty sequence gives
    ``""``; an invalid host name raises HostlistError.
    """
    for host in hosts:
        if not is_valid_hostname(host):
            raise HostlistError(f"invalid host name {host!r}")
    items: list[str] = []
    for (prefix, _, suffix), group in itertools.groupby(hosts, key=_name_key):
        numbers = [_split_name(host)[1] for host in group]
        items.append(_format_item(prefix, numbers, suffix))
    return ",".join(items)


def _split_name(host: str) -> tuple[str, str, str]:
    """(prefix, last digit run, suffix); the digit run is "" when the name has no digits."""
    match = _LAST_DIGITS_RE.fullmatch(host)
    if match is None:
        return host, "", ""
    return match.group(1), match.group(2), match.group(3)


def _name_key(host: str) -> tuple[str, bool, str]:
    """Adjacent hosts with equal keys share one item; digit-less names only match themselves."""
    prefix, digits, suffix = _split_name(host)
    return prefix, bool(digits), suffix


def _format_item(prefix: str, numbers: list[str], suffix: str) -> str:
    if not numbers[0]:  # names without digits pass through, one item each
        return ",".join(prefix for _ in numbers)
    if len(numbers) == 1:
        return f"{prefix}{numbers[0]}{suffix}"
    return f"{prefix}[{','.join(_number_runs(numbers))}]{suffix}"


def _number_runs(numbers: list[str]) -> list[str]:
    """Merge ascending consecutive numbers whose text the range expansion reproduces."""
    runs: list[list[str]] = []
    for number in numbers:
        run = runs[-1] if runs else None
        if run is not None and _extends(run, number):
            run.append(number)
        else:
            runs.append([number])
    return [run[0] if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs]


def _extends(run: list[str], number: str) -> bool:
    """True when ``run[0]-number`` expands to exactly ``run + [number]``."""
    value = int(number)
    return value == int(run[-1]) + 1 and str(value).zfill(len(run[0])) == number


# --------------------------------------------------------------------------- PBS


def read_pbs_nodefile(path: Path) -> list[str]:
    """Distinct hosts of a PBS nodefile in first-seen order.

    PBS repeats a host once per slot; we want hosts, not slots. Blank lines are skipped.
    An unreadable file, an invalid host name, or a file with no hosts raises HostlistError.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise HostlistError(f"cannot read PBS nodefile {str(path)!r}: {exc}") from exc
    hosts: dict[str, None] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        host = line.strip()
        if not host:
            continue
        if not is_valid_hostname(host):
            raise HostlistError(f"invalid host name {host!r} on line {lineno} of PBS nodefile {str(path)!r}")
        hosts.setdefault(host, None)
    if not hosts:
        raise HostlistError(f"PBS nodefile {str(path)!r} lists no hosts")
    return list(hosts)


# --------------------------------------------------------------------------- allocation


class Allocation(msgspec.Struct, frozen=True):
    """The distinct hosts a job runs on, and where that list came from."""

    hosts: tuple[str, ...]
    source: str

    def __post_init__(self) -> None:
        if not self.hosts:
            raise HostlistError("allocation has no hosts")
        if self.source not in SOURCES:
            raise HostlistError(f"unknown allocation source {self.source!r} (expected one of {SOURCES})")

    @property
    def rank0_host(self) -> str:
        """Host of global rank 0, which also serves the c10d rendezvous."""
        return self.hosts[0]


def resolve_allocation(nodelist: str | None, env: Mapping[str, str], nodes: int) -> Allocation:
    """Pick the job's hosts: explicit ``nodelist``, else Slurm, else PBS, else localhost.

    Slurm is read from ``SLURM_JOB_NODELIST`` (falling back to ``SLURM_NODELIST``), PBS from
    the file named by ``PBS_NODEFILE``; empty variables count as unset. Duplicate hosts are
    dropped (one torchrun agent per host). A real allocation with fewer distinct hosts than
    ``nodes`` is an error; a larger one is cut to its first ``nodes`` hosts. Without any
    scheduler we run on ``("localhost",)`` whatever ``nodes`` is (dev mode).
    """
    if nodes < 1:
        raise HostlistError(f"--nodes must be >= 1, got {nodes}")
    found = _find_hosts(nodelist, env)
    if found is None:
        return Allocation(hosts=("localhost",), source="localhost")
    source, hosts = found
    distinct = list(dict.fromkeys(hosts))
    if len(distinct) < nodes:
        raise HostlistError(
            f"allocation has {len(distinct)} host(s) ({compress_hostlist(distinct)}) "
            f"but --nodes {nodes} was asked (source: {source})"
        )
    return Allocation(hosts=tuple(distinct[:nodes]), source=source)


def _find_hosts(nodelist: str | None, env: Mapping[str, str]) -> tuple[str, list[str]] | None:
    """(source, hosts) from the first source that is set, or None for dev mode."""
    if nodelist is not None:
        return "nodelist", expand_hostlist(nodelist)
    slurm = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if slurm:
        return "slurm", expand_hostlist(slurm)
    nodefile = env.get("PBS_NODEFILE")
    if nodefile:
        return "pbs", read_pbs_nodefile(Path(nodefile))
    return None
