"""Where checkpoints live: the one module that knows their directory and file names.

    <root>/<run_id>/step-<N>/                  a checkpoint: data files, `manifest.json`, `.complete` (last)
    <root>/<run_id>/.step-<N>.tmp[-<writer>]/  one being assembled (its copies land as `<name>.partial`)
    <root>/<run_id>/step-<N>.<kind>-<tag>/     one set aside as evidence: corrupt, unrecorded or superseded
    <root>/<run_id>/.probe-<nonce>             written, read back and removed at start-up (writable?)
    <stage dir>/rank-<R>/step-<N>/             a rank's node-local copy before fan-out (async saves)

On an object store (no directories, no rename) the same names are key prefixes under `<prefix>/<run_id>/`:
`step-<N>/<file>`, `step-<N>/manifest.json`, `step-<N>/.complete` (one conditional put, last), and
`step-<N>/.writer`, the claim a writer puts (conditionally) before anything else; a quarantined step is copied
to `step-<N>.<kind>-<tag>/` and deleted. The attempt fence is the object `<prefix>/<run_id>/.attempt`, beside the
steps: an object, not a key prefix, so a listing of the run's steps never sees it, and no step name either.

Writers, the trainer's resume, retention and the experiment's analysis all name and list through here, so a
set-aside name written by one is the name the others look for.
"""

import os
import re
import stat
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Final, Literal, cast, get_args

import msgspec

MANIFEST: Final = "manifest.json"
WRITER_CLAIM: Final = ".writer"
"""On an object store: the object a writer claims a step with (conditionally, first), naming itself."""
MARKER: Final = ".complete"
MIN_KEEP: Final = 2
"""Retention keeps at least the newest checkpoint and the one before it, on every backend: the newest may be
the one a failure interrupted while it was being verified, and a prune never deletes the only good one."""


def check_keep(keep: int) -> int:
    """`keep` when it keeps at least MIN_KEEP checkpoints; else ValueError naming it."""
    if keep < MIN_KEEP:
        raise ValueError(f"keep={keep}: at least {MIN_KEEP} checkpoints must be kept")
    return keep


def retire(sealed: Sequence[int], keep: int, accepted: Collection[int] | None) -> list[int]:
    """Retention's one rule (`workers.storage.file.retention`): the steps of `sealed` (a run's sealed steps, newest
    first) to delete, those beyond the newest `keep` (at least MIN_KEEP) of the steps in `accepted`, the
    steps the log vouches for; a sealed step the log never accepted is neither counted nor deleted. None: no
    log, every sealed step counts. ValueError for a `keep` below MIN_KEEP."""
    check_keep(keep)
    return [step for step in sealed if accepted is None or step in accepted][keep:]


ATTEMPT: Final = ".attempt"
"""The attempt that owns a run's checkpoints: a file in its directory (`workers.storage.file.fence_file`), or an object directly
under its key prefix (`workers.storage.s3.fence_object`)."""
PARTIAL: Final = ".partial"
RESERVED: Final = frozenset({MANIFEST, MARKER})
"""Names a checkpoint's data files may not take."""

SetAsideKind = Literal["corrupt", "unrecorded", "superseded"]
"""Why a checkpoint was set aside: it failed verification; it was sealed but the log never recorded it (nothing
vouches for it); a `--no-resume` start took over its step name."""

_STEP = re.compile(r"step-([0-9]+)")
_ASSEMBLY = re.compile(r"\.step-[0-9]+\.tmp(-.+)?")
_SET_ASIDE = re.compile(rf"step-([0-9]+)\.({'|'.join(get_args(SetAsideKind))})-(.+)")


class SetAside(msgspec.Struct, frozen=True):
    """A checkpoint directory moved out of the way, kept as evidence."""

    step: int
    kind: SetAsideKind
    path: Path


def run_dir(root: Path, run_id: str) -> Path:
    """The directory of a run's checkpoints under a storage root."""
    return root / run_id


def step_dir(parent: Path, step: int) -> Path:
    """The directory of `step` under a run directory (or a rank's staging directory)."""
    return parent / step_name(step)


def checkpoint_path(root: Path, run_id: str, step: int) -> Path:
    """Where the checkpoint of `run_id` at `step` lives."""
    return step_dir(run_dir(root, run_id), step)


def assembly_dir(run: Path, step: int, writer: str = "") -> Path:
    """The hidden directory a checkpoint is assembled in before its rename to `step-N`. The trainer's ranks
    share one (no `writer`); a writer that may race another of the same step names itself."""
    return run / f".step-{step}.tmp{f'-{writer}' if writer else ''}"


def attempt_file(run: Path) -> Path:
    """The file naming the attempt that owns the run's directory (`workers.storage.file.fence_file`)."""
    return run / ATTEMPT


def probe_name(nonce: str) -> str:
    """The file (on an object store, the object) a start-up writes beside the steps, reads back and removes,
    to prove the run's location writable before the first step (`workers.storage.probe`); no listing of
    steps sees it."""
    return f".probe-{nonce}"


def run_key(prefix: str, run_id: str) -> str:
    """On an object store: the key prefix (ending in '/') of a run's objects under the storage prefix."""
    return f"{prefix}/{run_id}/" if prefix else f"{run_id}/"


def attempt_key(run_prefix: str) -> str:
    """On an object store: the key of the object naming the attempt that owns the run's checkpoints, directly
    under the run's key prefix (`run_key`; `workers.storage.s3.fence_object`)."""
    return run_prefix + ATTEMPT


def partial_path(path: Path) -> Path:
    """Where a copy to `path` lands until it is verified."""
    return path.with_name(path.name + PARTIAL)


def rank_stage_dir(stage_dir: Path, rank: int) -> Path:
    """A rank's node-local staging directory (async saves)."""
    return stage_dir / f"rank-{rank}"


def set_aside_path(path: Path, kind: SetAsideKind, tag: str) -> Path:
    """The name a checkpoint directory is set aside under: `step-<N>.<kind>-<tag>`, next to it."""
    return path.with_name(set_aside_name(path.name, kind, tag))


def step_name(step: int) -> str:
    """The name of a step's checkpoint (a directory, or an object store's key prefix segment)."""
    return f"step-{step}"


def set_aside_name(name: str, kind: SetAsideKind, tag: str) -> str:
    """The name a checkpoint `name` is set aside under."""
    return f"{name}.{kind}-{tag}"


def parse_step(name: str) -> int | None:
    """The step of a checkpoint directory's name (`step-<N>`), None for any other name."""
    match = _STEP.fullmatch(name)
    return int(match.group(1)) if match else None


def parse_set_aside(name: str) -> tuple[int, SetAsideKind] | None:
    """Step and kind of a set-aside directory's name, None for any other name."""
    match = _SET_ASIDE.fullmatch(name)
    if match is None:
        return None
    step, kind, tag = int(match.group(1)), cast(SetAsideKind, match.group(2)), match.group(3)
    if kind == "corrupt" and tag.startswith("unrecorded-"):
        return step, "unrecorded"  # the name trainers wrote before `unrecorded` was a kind of its own
    return step, kind


def complete_steps(run: Path) -> list[int]:
    """Steps of the checkpoints under `run` that carry a completion marker, newest first (unverified). Only
    directories of the run's own count: a `step-N` that is a link (to anywhere) is no checkpoint of it."""
    steps = [
        step
        for name in _names(run)
        if (step := parse_step(name)) is not None
        and _real_dir(os.path.join(run, name))
        and os.path.exists(os.path.join(run, name, MARKER))
    ]
    return sorted(steps, reverse=True)


def _real_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def set_asides(run: Path) -> list[SetAside]:
    """The checkpoint directories set aside under `run`, by step."""
    found = [
        SetAside(parsed[0], parsed[1], run / name)
        for name in _names(run)
        if (parsed := parse_set_aside(name)) is not None
    ]
    return sorted(found, key=lambda s: (s.step, s.path.name))


def process_writer(host: str, pid: int, nonce: str) -> str:
    """The writer tag of one process's assembly directory: the host and process that own it, so a later
    writer on the same host can tell a dead writer's leftovers (a `kill -9` mid-write) from live work."""
    return f"{host}-{pid}-{nonce}"


def assembly_writer(path: Path) -> tuple[str, int] | None:
    """(host, pid) of the process that named this assembly directory; None when no process did (the trainer's
    assemblies are named by step and attempt) or the name is not one of ours."""
    match = _ASSEMBLY.fullmatch(path.name)
    writer = match.group(1) if match else None
    parts = writer[1:].rsplit("-", 2) if writer else []
    if len(parts) != 3 or not parts[0] or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1])


def assemblies(run: Path) -> list[Path]:
    """The assembly directories under `run`: saves that were interrupted, when no save is running."""
    return [run / name for name in _names(run) if _ASSEMBLY.fullmatch(name)]


def _names(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []
