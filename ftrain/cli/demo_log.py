"""`ftrain demo --log-only`: the control-plane scenario played through the real CLI against the configured log
(no torch, no training: what the log, the projection and the checkpoint checks do on their own).

Launch, two checkpoints, a preemption, the newest checkpoint corrupted on disk, a resume that refuses it
and falls back to the older one, a further checkpoint, completion, status, and an audit of the chain.
"""

import contextlib
import io
import json
import os
import re
import sys

from ftrain.cli.demo_runner import Shell
from ftrain.errors import UsageError
from ftrain.service.run_commands import checkpoint_storage
from ftrain.workers.layout import checkpoint_path
from ftrain.workers.storage.location import uri_path
from ftrain.workers.storage.open import is_object_storage


def _launch(ftrain: Shell, *argv: str) -> str | None:
    """Run `ftrain launch`, showing its output, and return the run id it chose (None if it failed)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = ftrain(*argv)
    sys.stdout.write(out.getvalue())
    match = re.search(r"^Launched (\S+) ", out.getvalue(), re.MULTILINE)
    return match.group(1) if code == 0 and match else None


def _state(step: int) -> str:
    return json.dumps(
        {"optimizer": "adam", "lr": 0.0003, "step": step, "loss": round(4.0 / (1 + step / 500), 4)}
    )


def run_log_demo(ftrain: Shell) -> int:
    """Play the scenario; returns the first non-zero exit code, or 0."""
    run_id = _launch(ftrain, "launch", "JPCP", "--nodes", "2", "--gpus-per-node", "4", "--strategy", "fsdp",
                     "--nodelist", "node[07-08]", "--dataset-revision", "A1-rev-42", "--checkpoint-every", "10min")  # fmt: skip
    if run_id is None:
        return 1
    code = _play(
        ftrain,
        ("checkpoint", run_id, "--step", "500", "--epoch", "2", "--shards", "8", "--state", _state(500)),
        ("checkpoint", run_id, "--step", "1000", "--epoch", "5", "--shards", "8", "--state", _state(1000)),
        ("fail", run_id, "--reason", "preempted"),
    )
    if code:
        return code
    storage = checkpoint_storage(os.environ)
    if is_object_storage(storage):
        raise UsageError("demo --log-only flips a bit on file:// storage; unset FTRAIN_STORAGE or use a path")
    victim = checkpoint_path(uri_path(storage), run_id, 1000) / "state.json"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    print(f"\n# flipped one bit of {victim} (silent corruption on the shared FS)", flush=True)
    return _play(
        ftrain,
        ("resume", run_id),
        ("checkpoint", run_id, "--step", "1500", "--epoch", "7", "--shards", "8", "--state", _state(1500)),
        ("complete", run_id),
        ("status", run_id),
        ("audit", "verify", run_id),
    )


def _play(ftrain: Shell, *commands: tuple[str, ...]) -> int:
    """Run commands in order; the first non-zero exit code stops the scenario."""
    for argv in commands:
        if code := ftrain(*argv):
            return code
    return 0
