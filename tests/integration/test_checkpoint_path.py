"""`ftrain checkpoint --path`: a directory holding what cannot be copied as a checkpoint's data is bad input,
refused in one line that names the file, exit 2, before anything is written or appended."""

import errno
import os
import socket
from pathlib import Path

import pytest

from tests.support.cli import Cli, ckpt_args, launch


def refused(cli: Cli, path: Path) -> str:
    """`checkpoint --path path`'s error line, checked to have written nothing."""
    before = cli.last_seq()
    code, out, err = cli(*ckpt_args("5", "0", "1", "--path", str(path)))
    assert (code, out) == (2, "") and err.count("\n") == 1 and "Traceback" not in err, err
    assert cli.last_seq() == before
    assert not any(cli.storage().rglob("step-5"))
    return err


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux's /proc")
def test_a_proc_directory_is_refused_naming_the_file(cli: Cli) -> None:
    launch(cli)
    err = refused(cli, Path("/proc/self"))
    assert err.startswith("ftrain checkpoint: error: --path /proc/self: "), err
    name = err.split(": ")[3]
    assert (Path("/proc/self") / name).exists(), err


def test_what_is_no_regular_file_is_refused_not_left_out(cli: Cli, tmp_path: Path) -> None:
    launch(cli)
    shards = tmp_path / "dcp"
    shards.mkdir()
    (shards / "__0_0.distcp").write_bytes(b"x" * 100)
    (shards / "gone").symlink_to(tmp_path / "nowhere")
    assert refused(cli, shards) == (
        f"ftrain checkpoint: error: --path {shards}: gone: No such file or directory\n"
    )
    (shards / "gone").unlink()
    os.mkfifo(shards / "pipe")  # opened without blocking, then refused
    assert refused(cli, shards) == f"ftrain checkpoint: error: --path {shards}: pipe: not a regular file\n"
    (shards / "pipe").unlink()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(shards / "sock"))
        assert refused(cli, shards).endswith(f": sock: {os.strerror(errno.ENXIO)}\n")  # a socket never opens
