"""The work of `checkpoint`, `resume`, `fail` and `complete` (their parser: `record_cmd`), each in the two
halves of a `log_command.Command`: `prepare` checks the input before anything connects or writes (a usage
error leaves no trace), `run` executes it against the service and prints the result."""

import argparse
import os
import stat
from pathlib import Path
from typing import NamedTuple

import msgspec

from ftrain import settings
from ftrain.cli import documents, render
from ftrain.errors import Refused, UsageError
from ftrain.events.schema import CorruptSkipped
from ftrain.service import RunService
from ftrain.workers.layout import RESERVED

MAX_STATE_BYTES = 1024 * 1024


# -- checkpoint --------------------------------------------------------------------------------------------


class CheckpointInput(NamedTuple):
    """What `checkpoint` writes: its data files, and the algorithm they are hashed with (FTRAIN_DIGEST)."""

    sources: list[tuple[str, bytes | Path]]
    digest: str


def prepare_checkpoint(args: argparse.Namespace) -> CheckpointInput:
    """Read and check the checkpoint's contents and the digest setting before anything is written."""
    digest = settings.digest(os.environ)
    return CheckpointInput(_sources(args), digest)


def _sources(args: argparse.Namespace) -> list[tuple[str, bytes | Path]]:
    if args.state is not None:
        try:
            return [("state.json", _state_json(args.state.encode()))]
        except UnicodeEncodeError:
            raise UsageError("--state is not valid UTF-8") from None
    if args.state_file is not None:
        return [("state.json", _state_json(_read_capped(args.state_file)))]
    return _directory_sources(args.path, args.shards)


def _read_capped(path: Path) -> bytes:
    """At most MAX_STATE_BYTES of `path`, read as a stream: /dev/zero or a FIFO must not fill memory."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_STATE_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"--state-file {path}: {exc.strerror or exc}") from exc
    if len(data) > MAX_STATE_BYTES:
        raise UsageError(f"--state-file {path}: larger than {MAX_STATE_BYTES} bytes")
    return data


def _state_json(raw: bytes) -> bytes:
    """The training state, canonical. Strict JSON only: NaN, an infinity (1e999), invalid UTF-8 or a lone
    surrogate is refused rather than stored as something else, and so is nesting past the decoder's depth."""
    if len(raw) > MAX_STATE_BYTES:
        raise UsageError(f"the training state is larger than {MAX_STATE_BYTES} bytes")
    try:
        return msgspec.json.encode(msgspec.json.decode(raw), order="sorted")
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise UsageError(f"the training state is not valid JSON ({exc})") from exc
    except RecursionError:
        raise UsageError("the training state is nested too deeply") from None


def _directory_sources(path: Path, shards: int) -> list[tuple[str, bytes | Path]]:
    """Every file under `path` (sub-directories included), checked; anything that is not a directory must be
    a file ftrain can copy, or the input is refused naming it: nothing is left out silently."""
    if not path.is_dir():
        raise UsageError(f"--path {path}: not a directory")
    try:
        files = sorted(p for p in path.rglob("*") if not p.is_dir())
    except OSError as exc:
        raise UsageError(f"--path {path}: {exc.strerror or exc}") from exc
    if not files:
        raise UsageError(f"--path {path}: no files")
    names = [str(p.relative_to(path)) for p in files]
    if bad := next((n for n in names if not _is_utf8(n)), None):
        raise UsageError(f"--path {path}: file name {bad!r} is not valid UTF-8")
    if RESERVED & set(names):
        raise UsageError(
            f"--path {path}: already holds a manifest or marker (is it a checkpoint of ftrain's?)"
        )
    dcp_shards = [n for n in names if n.endswith(".distcp")]
    if dcp_shards and len(dcp_shards) != shards:
        raise UsageError(
            f"--path {path} holds {len(dcp_shards)} .distcp shard(s) but --shards {shards} was given"
        )
    for name, file in zip(names, files, strict=True):
        if why := _not_copyable(file):
            raise UsageError(f"--path {path}: {name}: {why}")
    return list(zip(names, files, strict=True))


def _not_copyable(file: Path) -> str | None:
    """Why `file` cannot be a checkpoint's data file (None: it can): it must open and read as a regular
    file that holds what its size says. A /proc or /sys file claims 0 bytes and holds more, or refuses the
    read or the kernel copy outright; a FIFO, a socket, a device or a dangling link is no file to copy."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # non-blocking: a FIFO must not hang
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return "not a regular file"
            if os.pread(fd, 1, 0) and info.st_size == 0:
                return "its size is 0 bytes but it holds data (a /proc or /sys file?)"
        finally:
            os.close(fd)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _is_utf8(name: str) -> bool:
    """Whether a file name decoded from the file system is real text (undecodable bytes become surrogates)."""
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return True


async def run_checkpoint(app: RunService, args: argparse.Namespace, written: CheckpointInput) -> int:
    """Write the checkpoint, then record it."""
    event = await app.checkpoint(
        args.run_id,
        step=args.step,
        epoch=args.epoch,
        shards=args.shards,
        sources=written.sources,
        digest=written.digest,
    )
    if args.json:
        render.emit_json(documents.checkpointed(event))
    else:
        render.emit(render.checkpointed(event))
    return 0


# -- resume, fail, complete ----------------------------------------------------------------------------------


async def run_resume(app: RunService, args: argparse.Namespace, _: None) -> int:
    """Skip invalid checkpoints newest first and resume from the first valid one; exit 1 if none is."""

    async def announce(event: CorruptSkipped) -> None:
        render.emit(render.skipped(event))

    outcome = await app.resume(args.run_id, force=args.force, on_skip=announce)
    if outcome.resumed is None:
        recorded = outcome.state.checkpoints if outcome.state else ()
        if not recorded:
            raise Refused(f"run {args.run_id} has no checkpoint to resume from")
        pruned = sum(c.status == "pruned" for c in recorded)
        also = f", {pruned} more pruned by retention" if pruned else ""
        raise Refused(
            f"run {args.run_id}: no valid checkpoint ({len(recorded) - pruned} recorded, all invalid{also}); "
            "not restarting"
        )
    if args.json:
        render.emit_json(documents.resumed(outcome.resumed, outcome.skipped))
    else:
        render.emit(render.resumed(outcome.resumed))
    return 0


async def run_fail(app: RunService, args: argparse.Namespace, _: None) -> int:
    """Record a failure."""
    event = await app.fail(args.run_id, reason=args.reason, exit_code=args.exit_code, message=args.message)
    state = await app.state_of(args.run_id)
    if args.json:
        render.emit_json(documents.failed(event, state))
    else:
        render.emit(render.failed(event, state))
    return 0


async def run_complete(app: RunService, args: argparse.Namespace, _: None) -> int:
    """Record completion, with its cost in the run's unit."""
    event = await app.complete(args.run_id, cost_gpu_hours=args.cost_hours)
    unit = (await app.state_of(args.run_id)).cost_unit
    if args.json:
        render.emit_json(documents.completed(event, unit))
    else:
        render.emit(render.completed(event, unit))
    return 0
