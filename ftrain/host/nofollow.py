"""Removing and renaming entries of a run's directory without following symbolic links.

Anyone who can write to a run's directory can plant `step-N` as a link to a directory elsewhere; pruning,
quarantine and cleanup then act on the entry itself, through a descriptor of the directory that holds it,
never on what a link points at. A link is left alone (or, when renamed, only the link moves).
"""

import errno
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)


@contextmanager
def _opened(path: Path | str, dir_fd: int | None = None) -> Iterator[int]:
    """A descriptor of the directory `path` (relative to `dir_fd` when given), its last part not followed."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        yield fd
    finally:
        os.close(fd)


def remove_dir(parent: Path, name: str, *, first: str | None = None, unlink_link: bool = False) -> bool:
    """Remove the directory `name` under `parent` and all it holds, never following a link: a link (or
    anything but a directory) there is left alone and False returned, unless `unlink_link` (a name ftrain
    is about to write through: the link itself is removed, never what it points at). `first` names a file
    removed before the rest (a completion marker: a half-removed checkpoint must not look complete). What
    cannot be removed is logged and stays; `parent` out of reach raises OSError."""
    try:
        with _opened(parent) as parent_fd:
            try:
                with _opened(name, parent_fd) as fd:
                    if first is not None:
                        with suppress(FileNotFoundError):
                            os.unlink(first, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    if unlink_link and os.path.islink(parent / name):
                        os.unlink(name, dir_fd=parent_fd)
                        log.warning("link_removed", path=str(parent / name))
                        return True
                    log.warning("not_a_directory_left_alone", path=str(parent / name))
                    return False
                if exc.errno == errno.ENOENT:
                    return False
                raise
            # the descriptor-based walk never follows a link; what cannot be removed stays, the rest goes
            shutil.rmtree(name, onerror=_not_removed, dir_fd=parent_fd)
    except FileNotFoundError:
        return False
    return True


def rename_entry(parent: Path, name: str, new_name: str) -> bool:
    """Rename the entry `name` of `parent` to `new_name` beside it (a link is renamed as a link, what it
    points at is never touched); False when it is gone."""
    with _opened(parent) as fd:
        try:
            os.rename(name, new_name, src_dir_fd=fd, dst_dir_fd=fd)
        except FileNotFoundError:
            return False
        os.fsync(fd)
    return True


def _not_removed(
    _function: object, path: str, exc_info: tuple[type[BaseException], BaseException, object]
) -> None:
    log.warning("not_removed", path=path, error=str(exc_info[1]))
