"""A node lost under a real Slurm: two slurmd, one per network namespace (tests/support/slurm_cluster.py), the
example multi-node batch script as written, one srun step of torchrun per node (2 CPU processes each, gloo),
the log on a NATS server the nodes reach over the bridge."""

import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import nkeys
import pytest

from ftrain.events.jetstream.nats_server import nats_server_binary
from tests.e2e.test_slurm_jobs import EXAMPLES, events, gist, job_env, trained, wait_for
from tests.support.processes import free_port
from tests.support.slurm_cluster import Slurm
from tests.support.slurm_cluster import slurm2 as slurm2  # the fixture
from tests.support.training import FINAL, final_digest, torchrun

pytestmark = pytest.mark.timeout(900)
ITERS = ("--train-iters", "20", "--save-interval", "5")


def bridge_nats(slurm: Slurm, directory: Path) -> tuple[dict[str, str], subprocess.Popen[bytes]]:
    """A nats-server on the host's bridge address (the nodes have no route to 127.0.0.1) with one nkey user;
    the settings a client there sets, and the process."""
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    directory.mkdir(parents=True)
    seed_file = directory / "user.nk"
    seed_file.write_bytes(seed)
    seed_file.chmod(0o600)
    user = nkeys.from_seed(bytearray(seed)).public_key.decode()
    addr, port = slurm.controller_addr, free_port()
    (directory / "server.conf").write_text(
        f'listen: "{addr}:{port}"\nauthorization {{ users = [ {{ nkey: "{user}" }} ] }}\n'
        f'jetstream {{ store_dir: "{directory / "store"}" }}\n'
    )
    log = (directory / "server.log").open("wb")
    proc = subprocess.Popen([str(nats_server_binary()), "-c", str(directory / "server.conf")], stdout=log,
                            stderr=log)  # fmt: skip
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection((addr, port), timeout=0.2).close()
            break
        except OSError:
            assert time.monotonic() < deadline, (directory / "server.log").read_text()
            time.sleep(0.05)
    return {"FTRAIN_NATS_URL": f"nats://{addr}:{port}", "FTRAIN_NATS_NKEY": str(seed_file)}, proc


def test_a_node_lost_in_a_two_node_job_is_dropped_and_the_run_completes_on_the_other(
    slurm2: Slurm, tmp_path: Path
) -> None:
    """examples/slurm/train-multinode.sbatch on both nodes with MIN_NODES=1: once training passed step 7,
    node 2's slurmd and every process on it are SIGKILLed and its link cut. srun reports the node failure,
    `ftrain run` records `failed` (node-failure, naming it) and relaunches on node 1 alone, resharded from the
    last checkpoint; the run completes with the digest of the same schedule run without Slurm (4 ranks to
    that step, then 2 from it)."""
    nats_env, server = bridge_nats(slurm2, tmp_path / "nats")
    try:
        env = {**nats_env, "FTRAIN_HOME": str(tmp_path / "home"), "FTRAIN_STORAGE": str(tmp_path / "ckpt")}
        out = tmp_path / "job.out"
        train = " ".join(("-m", "ftrain.examples.train", *ITERS))
        job = slurm2.sbatch(f"--output={out}", str(EXAMPLES / "train-multinode.sbatch"),
                            env=job_env(env, "two", TRAIN=train, MIN_NODES="1"), cwd=tmp_path)  # fmt: skip
        run, ckpt = f"two-slurm-{job}", tmp_path / "ckpt" / f"two-slurm-{job}"
        wait_for(lambda: any(m.get("train/iter", 0) >= 7 for m in trained(ckpt)), "step 7", 180, slurm2, out)
        crashed = time.time()
        slurm2.kill_node(slurm2.nodes[1])
        done = slurm2.wait_job(job, ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"], 400)
        ended = time.time()
        text = out.read_text()
        assert done["JobState"] == "COMPLETED", text[-4000:]
        seen = events(run, env)
    finally:
        server.kill()
        server.wait()
    lost = next(e for e in seen if e["type"] == "failed")
    opened = seen[seen.index(lost) + 1]
    assert (lost["reason"], lost["message"]) == ("node-failure", f"node {slurm2.nodes[1]} lost: its command was "
                                                 "killed by SIGKILL"), gist(seen)  # fmt: skip
    assert (opened["type"], opened["hosts"]) == ("resumed", [slurm2.nodes[0]]), gist(seen)
    assert f"going on without {slurm2.nodes[1]} (--min-nodes 1)" in text
    assert seen[-1]["type"] == "completed"
    shards = [(e["step"], e["shards"]) for e in seen if e["type"] == "checkpointed"]
    assert shards == [(s, 4) for s in range(5, opened["step"] + 1, 5)] + [(s, 2) for s in
                                                                          range(opened["step"] + 5, 21, 5)]  # fmt: skip

    same = tmp_path / "same-schedule"
    four = torchrun(same, *ITERS, nproc=4, kill_at=f"sealed:{opened['step']}")
    assert four.returncode != 0 and (same / f"step-{opened['step']}").is_dir(), four.stderr[-2000:]
    assert FINAL.findall(text)[-1][1] == final_digest(torchrun(same, *ITERS, nproc=2))
    first = next(m for m in trained(ckpt) if "train/restart_seconds" in m)
    print(f"\n2-node job, node 2 lost: `failed` in the log {lost_at(lost) - crashed:.1f} s after the crash, "
          f"`resumed` on node 1 at {lost_at(opened) - crashed:.1f} s, training again at "
          f"{first['time'] - crashed:.1f} s (lost steps {first['train/lost_steps']}), job done {ended - crashed:.1f} s "
          f"after it; events: {' '.join(gist(seen))}")  # fmt: skip


def lost_at(event: dict[str, Any]) -> float:
    from datetime import datetime

    return datetime.fromisoformat(event["time"]).timestamp()
