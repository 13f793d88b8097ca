"""`private_dir` alone, on real directories: it refuses what it cannot own, leaves a storage root as the user
made it, and accepts a parent only the user's own private group may write to (homes through the real CLI:
tests/integration/test_private_homes.py)."""

import os
import stat
from pathlib import Path

import pytest

from ftrain.host.private_files import UnsafeDirectory, private_dir


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_private_dir_refuses_what_it_cannot_own_and_leaves_storage_roots_alone(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UnsafeDirectory, match=r"shared is writable by group or others \(mode 777\)"):
        private_dir(shared)
    assert mode(shared) == 0o777
    with pytest.raises(
        UnsafeDirectory, match=r"shared \(above \S+/shared/home\) is writable by group or others"
    ):
        private_dir(shared / "home")
    assert not (shared / "home").exists()
    assert private_dir(shared / "root", tighten=False) == shared / "root"  # a user's storage: as before
    assert (mode(shared), mode(shared / "root")) == (0o777, 0o700)
    (tmp_path / "read").mkdir(mode=0o755)  # readable by others, writable by none: ours, tightened
    assert mode(private_dir(tmp_path / "read")) == 0o700


def _own_private_group() -> bool:
    import grp
    import pwd

    user = pwd.getpwuid(os.getuid()).pw_name
    group = grp.getgrgid(os.getgid())
    return group.gr_name == user and set(group.gr_mem) <= {user}


@pytest.mark.skipif(not _own_private_group(), reason="this user's primary group is not a user-private group")
def test_a_parent_only_the_users_own_private_group_may_write_to_is_accepted(tmp_path: Path) -> None:
    """Debian's user-private groups under umask 002 leave `~/.local/share` 0775: its group is the user
    alone, so the home below it is safe; the same mode with a group others belong to is not."""
    share = tmp_path / "share"
    share.mkdir()
    share.chmod(0o775)
    assert mode(private_dir(share / "ftrain")) == 0o700
    with pytest.raises(UnsafeDirectory, match="group or others"):
        private_dir(share)  # the private directory itself must be 0700 all the same
    if os.getuid() != 0:
        return
    os.chown(share, -1, 65534)  # nogroup: not this user's own
    with pytest.raises(
        UnsafeDirectory, match=r"share \(above .*\) is writable by group or others \(mode 775\)"
    ):
        private_dir(share / "ftrain")
