"""Everything ftrain keeps is private to its user: directories 0700, files 0600, whatever the umask; and a
directory it keeps them in is only ever its user's.

Other users share the login and compute nodes. The umask only removes bits, so an explicit mode at creation
(then a chmod, for a umask that removed the owner's own bits) is enough for what ftrain creates, every missing
parent included. A directory found another user's, writable by others or a link (or below one that others
could write to) is refused, never adopted nor chmod-ed into use: whoever could write there may already have
planted or swapped what is inside (a signing key, a trust list). One looser only in its read bits (a home an
older version made) is tightened: no one else could have changed it. This module is the one place that decides.
"""

import grp
import os
import pwd
import stat
from contextlib import suppress
from pathlib import Path
from typing import Final

DIR_MODE: Final = 0o700
FILE_MODE: Final = 0o600
OWN_ONE: Final = "use a directory of your own"


class UnsafeDirectory(PermissionError):
    """A directory ftrain would keep private files in, or one above it, is a link, another user's, or
    writable by others: refused (the CLI exits 2 naming it)."""


def private_dir(path: Path, *, tighten: bool = True) -> Path:
    """`mkdir -p` whose every created directory is 0700.

    `tighten` (a directory ftrain owns: a home, keys/, nats/): `path` must also be safe (`safe_dir`), and is
    made 0700 when others could read it. Without it (a user's storage root, perhaps on a shared file
    system, perhaps shared on purpose) what exists is neither judged nor changed."""
    if tighten:
        safe_dir(path)
        if stat.S_IMODE(os.lstat(path).st_mode) != DIR_MODE:
            os.chmod(path, DIR_MODE)
        return path
    missing = [p for p in (path, *path.parents) if not os.path.lexists(p)]
    for directory in reversed(missing):
        with suppress(FileExistsError):  # another process made it meanwhile
            directory.mkdir(mode=DIR_MODE)
        os.chmod(directory, DIR_MODE)
    return path


def safe_dir(path: Path, *, label: str | None = None, choose: str = OWN_ONE) -> Path:
    """`path` (absolute), created 0700 with any missing parents unless it exists; raises UnsafeDirectory
    unless it is a directory, not a link, owned by this user and not writable by group or others, and every
    directory above it is this user's or root's and, if others may write to it, sticky. What is above is
    checked before anything is created there. Messages name it `<label> <path>` (default "directory") and
    advise `choose` when it is another user's."""
    path = path.absolute()
    leaf, below = (f"{label} {path}", f"the {label}") if label else (f"directory {path}", str(path))
    missing = [p for p in (path, *path.parents) if not os.path.lexists(p)]
    check_above(missing[-1].parent if missing else path.parent, below=below, choose=choose)
    for directory in reversed(missing):
        with suppress(FileExistsError):  # another process made it meanwhile: judged like any other
            os.mkdir(directory, DIR_MODE)
        check_dir(directory, what=leaf if directory == path else f"directory {directory}", choose=choose)
        os.chmod(directory, DIR_MODE)  # a umask that removed the owner's own bits
    if not missing:
        check_dir(path, what=leaf, choose=choose)
    check_above(path.parent, below=below, choose=choose)
    return path


def check_dir(path: Path, *, what: str, choose: str = OWN_ONE) -> None:
    """Raise UnsafeDirectory (naming `path` as `what`) unless it is a directory, not a link, of this
    user's, that neither group nor others can write to."""
    _judge(os.lstat(path), what=what, leaf=True, choose=choose)


def check_above(directory: Path, *, below: str, choose: str = OWN_ONE) -> None:
    """Check `directory` and every one above it (this user's or root's; writable by others only if sticky),
    as directories above `below`; links among them are fine when they land somewhere safe."""
    real = directory.resolve()
    for above in (real, *real.parents):
        _judge(os.lstat(above), what=f"{above} (above {below})", leaf=False, choose=choose)


def _judge(st: os.stat_result, *, what: str, leaf: bool, choose: str) -> None:
    uid = os.getuid()
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeDirectory(f"{what} is a symbolic link; refusing to follow it")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectory(f"{what} is not a directory")
    if st.st_uid not in ((uid,) if leaf else (uid, 0)):
        raise UnsafeDirectory(f"{what} is owned by uid {st.st_uid}, not this user (uid {uid}); {choose}")
    mode = stat.S_IMODE(st.st_mode)
    if leaf and mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeDirectory(
            f"{what} is writable by group or others (mode {mode:o}), so what is in it may not be yours: "
            "check its contents, then chmod 700 it (or use another)"
        )
    if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX and not _own_group_only(st, mode):
        raise UnsafeDirectory(
            f"{what} is writable by group or others (mode {mode:o}) and not sticky, so they could replace "
            "what is below it: take their write access away (chmod go-w) or use another place"
        )


def _own_group_only(st: os.stat_result, mode: int) -> bool:
    """A directory of this user's that only its group may write to, where that group is the user's own
    (user-private groups, as Debian makes them, under umask 002: `~/.local/share` is then 0775): the group
    is the user's primary group, bears the user's name and lists no other member — OpenSSH's rule for the
    same case. Only above a private directory; the private one itself must be 0700."""
    if mode & stat.S_IWOTH or st.st_uid != os.getuid() or st.st_gid != os.getgid():
        return False
    try:
        user, group = pwd.getpwuid(st.st_uid).pw_name, grp.getgrgid(st.st_gid)
    except KeyError:
        return False
    return group.gr_name == user and set(group.gr_mem) <= {user}


def private_file(path: Path) -> Path:
    """Create `path` empty and 0600 if missing (an existing one keeps its bytes and is tightened to 0600):
    for files another library opens itself, such as a SQLite database, whose -wal and -shm copy its mode."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)
    return path


def open_private(path: Path, flags: int) -> int:
    """`os.open` that creates the file 0600, never readable by others even for an instant."""
    fd = os.open(path, flags | os.O_CREAT, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd
