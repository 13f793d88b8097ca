"""`ftrain demo`: a real 2-process CPU training job (a CPU job: costed in node-hours), preempted by a SIGKILL
and resumed, checked bit for bit.

1. an uninterrupted reference run of the reference trainer (FSDP2, gloo) gives the final parameter digest;
2. `ftrain run` supervises the same job with a SIGKILL injected once mid-way: the supervisor records the
   failure and relaunches, the trainer resumes from its newest valid checkpoint, the run completes;
3. `ftrain status` and `ftrain audit verify` read the run back from the log;
4. the two digests are compared: exact resume means they are equal.

With `--s3` the supervised run checkpoints to the embedded SeaweedFS (started, or reused, under FTRAIN_HOME as
`ftrain storage start` does, and left running): sync saves uploaded and sealed on S3, the resume downloaded and
verified from it; the reference run stays on the local file system, so equal digests also say S3 changed nothing.
"""

import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Final

from ftrain import settings
from ftrain.cli.demo_runner import Shell
from ftrain.supervise.attempts import free_port

ITERS, INTERVAL, KILL_STEP = 60, 10, 35
S3_PREFIX: Final = "checkpoints"
TRAIN = ("-m", "ftrain.examples.train", "--train-iters", str(ITERS), "--save-interval", str(INTERVAL))
FINAL = re.compile(r"FINAL step=\d+ params_sha256=([0-9a-f]{64})")


def _show(argv: list[str]) -> None:
    print(f"\n$ {shlex.join(argv)}", flush=True)


def _tee(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run a command, echoing its stdout as it comes; returns its exit code and stdout."""
    _show(argv)
    lines = []
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
    return proc.returncode, "".join(lines)


def _embedded_s3() -> tuple[dict[str, str], Callable[[str], list[int]]]:
    """Start (or reuse) the embedded SeaweedFS: the variables that point the job at it, and a lister of a
    run's sealed steps there."""
    from ftrain.workers.s3.seaweed_server import DEFAULT_BUCKET, ensure_storage_server
    from ftrain.workers.storage.location import Location
    from ftrain.workers.storage.s3.boto_client import make_client
    from ftrain.workers.storage.s3.run_prefix import S3Run

    proc = ensure_storage_server(settings.home(os.environ))
    root = f"s3://{DEFAULT_BUCKET}/{S3_PREFIX}"
    print(f"# checkpoints go to {root} on SeaweedFS at {proc.endpoint} (`ftrain storage stop` stops it)")
    client = make_client(endpoint=proc.endpoint, access_key=proc.access_key, secret_key=proc.secret_key)
    return {**proc.env(), settings.STORAGE: root}, lambda run: [
        d.step for d in S3Run(Location("s3", root, run), client=client).complete()
    ]


def run_demo(ftrain: Shell, *, s3: bool = False) -> int:
    """Play it; returns 0 when the interrupted run ends bit-identical to the uninterrupted one."""
    quiet = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR", "LOGLEVEL": "ERROR"}
    sealed: Callable[[str], list[int]] | None = None
    if s3:
        store_env, sealed = _embedded_s3()
        storage_env = {**quiet, **store_env}
    else:
        storage_env = quiet
    with tempfile.TemporaryDirectory(prefix="ftrain-demo-") as scratch:
        print(
            f"# 1. the reference: {ITERS} steps, uninterrupted (2 CPU processes, FSDP2 over gloo)", flush=True
        )
        reference_cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{free_port()}", *TRAIN, "--ckpt-dir", str(Path(scratch) / "reference"),
        ]  # fmt: skip
        code, out = _tee(reference_cmd, quiet)
        reference = FINAL.search(out)
        if code or reference is None:
            return code or 1

        print(f"\n# 2. the same job under the supervisor, SIGKILLed once after step {KILL_STEP}", flush=True)
        chaos = {
            **storage_env,
            settings.KILL_AT: f"step:{KILL_STEP}",
            settings.KILL_ONCE: str(Path(scratch) / "kills"),
        }
        run_cmd = [str(Path(sys.executable).with_name("ftrain")), "run", "demo", "--nodes", "1", "--nproc-per-node", "2",
                   "--nodelist", "localhost", "--max-retries", "2", "--backoff", "1", "--", *TRAIN]  # fmt: skip
        code, out = _tee(run_cmd, chaos)
        resumed = FINAL.search(out)
        launched = re.search(r"^Launched (\S+) ", out, re.MULTILINE)
        if code or resumed is None or launched is None:
            return code or 1

    run_id = launched.group(1)
    print("\n# 3. the run as the log tells it", flush=True)
    if code := ftrain("status", run_id) or ftrain("audit", "verify", run_id):
        return code
    if sealed is not None:
        steps = ", ".join(f"step-{n}" for n in sealed(run_id))
        print(f"sealed on S3 under {storage_env[settings.STORAGE]}/{run_id}/: {steps}", flush=True)

    print("\n# 4. exact resume", flush=True)
    same = reference.group(1) == resumed.group(1)
    print(f"uninterrupted         params_sha256={reference.group(1)}")
    print(f"killed and resumed    params_sha256={resumed.group(1)}")
    print("identical: the SIGKILL cost recomputed steps, nothing else" if same else "DIFFERENT", flush=True)
    return 0 if same else 1
