"""Progress of long transfers on a terminal: `ftrain checkpoint --path` shows a bar while it writes and
`ftrain resume` while it verifies, on stderr when it is a terminal (a real pseudo-terminal here), and nothing
when it is not (a pipe: logs, CI)."""

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

from tests.support.cli import RUN, ckpt_args

LAUNCH = ("launch", "JPCP", "--nodes", "2", "--gpus-per-node", "4", "--nodelist", "node[07-08]")


def ftrain(args: tuple[str, ...], env: dict[str, str], *, terminal: bool) -> tuple[int, str, str]:
    """Run the real console script, its stderr on a pseudo-terminal or a pipe: exit code, stdout, stderr."""
    command = [str(Path(sys.executable).with_name("ftrain")), *args]
    if not terminal:
        done = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
        return done.returncode, done.stdout, done.stderr
    controller, tty = pty.openpty()
    fcntl.ioctl(tty, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a 100-column terminal
    with subprocess.Popen(
        command, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=tty, text=True
    ) as proc:
        os.close(tty)
        seen = bytearray()
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the terminal's other end closed: the process is done with it
                break
            if not chunk:
                break
            seen += chunk
        out = proc.stdout.read() if proc.stdout else ""
        code = proc.wait(timeout=60)
    os.close(controller)
    return code, out, seen.decode(errors="replace")


def test_a_bar_on_a_terminal_and_none_on_a_pipe(env: dict[str, str], tmp_path: Path) -> None:
    shards = tmp_path / "dcp"
    shards.mkdir()
    for rank in range(2):
        (shards / f"__{rank}_0.distcp").write_bytes(os.urandom(24 << 20))
    (shards / ".metadata").write_bytes(b"meta")
    assert ftrain(LAUNCH, env, terminal=False)[0] == 0

    code, out, err = ftrain(ckpt_args("10", "1", "2", "--path", str(shards)), env, terminal=True)
    assert code == 0 and "Checkpoint step 10" in out, err
    assert "write step 10" in err and "48.0M" in err, err  # tqdm's bar, on the terminal only

    code, out, err = ftrain(ckpt_args("20", "2", "2", "--path", str(shards)), env, terminal=False)
    assert code == 0 and err == "", err

    assert ftrain(("fail", RUN, "--reason", "preempted"), env, terminal=False)[0] == 0
    code, out, err = ftrain(("resume", RUN), env, terminal=True)
    assert code == 0 and "Resuming" in out, err
    assert "verify step 20" in err, err
