"""Directories private to this user, for node-local staging of async saves.

Staging lives on shared nodes' local disks, typically under /tmp, where any user can create a name first:
a directory planted there (or a link to one elsewhere) would receive the checkpoint's bytes, or have its
contents deleted by the start-up cleanup. So a staging directory is created 0700, and used only while it
is a real directory owned by this user that no one else can write to, below directories only this user or
root control (or sticky ones, like /tmp, where others cannot move it).
"""

import os
import stat
import tempfile
from contextlib import suppress
from pathlib import Path


class UnsafeDirectory(PermissionError):
    """A directory ftrain would write into is a link, another user's, or writable by others."""


def default_stage_dir(job: str) -> Path:
    """The default staging directory of a job: `<tmp>/ftrain-<uid>/<job>`, per user and node-local."""
    return Path(tempfile.gettempdir()) / f"ftrain-{os.getuid()}" / job


def safe_stage_dir(path: Path) -> Path:
    """`path`, created (0700, with any missing parents) unless it exists; raises UnsafeDirectory unless it
    is a directory, not a link, owned by this user and not writable by group or others, and every
    directory above it is this user's or root's and, if others may write to it, sticky."""
    path = path.absolute()
    missing = [p for p in (path, *path.parents) if not os.path.lexists(p)]
    _check_above(missing[-1].parent if missing else path.parent)  # before creating anything there
    for directory in reversed(missing):
        with suppress(FileExistsError):  # another rank of this node made it meanwhile: checked below
            os.mkdir(directory, 0o700)
    _check(path, os.lstat(path), leaf=True)
    _check_above(path.parent)
    return path


def same_device(stage: Path, destination: Path) -> bool:
    """Whether files staged under `stage` would land on the device of `destination` (or of its nearest
    existing parent): then staging them first and copying them over would write every byte twice."""
    existing = next(p for p in (destination.absolute(), *destination.absolute().parents) if p.exists())
    return os.stat(stage).st_dev == os.stat(existing).st_dev


def claim_dir(parent: Path, name: str) -> bool:
    """The directory `name` under `parent` (a checked private directory), made 0700 by whichever of the
    processes sharing `parent` gets there first: True for that one (it removes the directory after), False
    for the others. Raises UnsafeDirectory unless what is there is a real directory of this user's that
    no one else can write to."""
    path = parent / name
    try:
        os.mkdir(path, 0o700)
        created = True
    except FileExistsError:
        created = False
    _check(path, os.lstat(path), leaf=True)
    return created


def _check_above(directory: Path) -> None:
    """Check `directory` and every one above it; links among them are fine when they land somewhere safe."""
    real = directory.resolve()
    for above in (real, *real.parents):
        _check(above, os.lstat(above), leaf=False)


def _check(path: Path, st: os.stat_result, *, leaf: bool) -> None:
    uid, what = os.getuid(), f"staging directory {path}" if leaf else f"{path} (above the staging directory)"
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeDirectory(f"{what} is a symbolic link; refusing to follow it")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectory(f"{what} is not a directory")
    if st.st_uid not in ((uid,) if leaf else (uid, 0)):
        raise UnsafeDirectory(
            f"{what} is owned by uid {st.st_uid}, not this user (uid {uid}); "
            "choose another with --ckpt-stage-dir"
        )
    writable_by_others = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable_by_others and (leaf or not st.st_mode & stat.S_ISVTX):
        raise UnsafeDirectory(
            f"{what} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); "
            "make it 0700 or choose another"
        )
