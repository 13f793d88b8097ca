"""The memory tier across nodes for real: `ftrain run --node-exec` over two network-namespace nodes (2 CPU
processes each, gloo, the debug model), each node with its own memory directory on a tmpfs, the log on the
3-node NATS cluster, and durable storage an S3 server (moto) on the third node behind a link shaped to 5 MB/s,
as a shared file system or object store at scale is far slower than node memory. Three unwarned failures, each
once snapshot 25 (and its replicas) is recorded, a step or more past it, newer than the durable step 20: one
rank SIGKILLed resumes from its node's memory; a node lost whole (every process SIGKILLed, its memory gone)
resumes from the replicas its peer node holds; both nodes' memory lost resumes from the durable store. Each
`resumed` event names its tier and step, the steps trained again are at most `memory_every` from memory (and
more from the durable store), the durable traffic went through the shaped link, and every run ends
bit-identical to an uninterrupted one."""

import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_multinode import (
    end_run,
    ended_with,
    events,
    on,
    rank_of,
    reached,
    restarts,
    summary,
    supervisor,
)
from tests.support.netns import FTRAIN
from tests.support.s3 import Endpoint
from tests.support.training import final_digest, torchrun, wait_for

pytestmark = pytest.mark.timeout(600)
EVERY, DURABLE, ITERS = 5, 20, 40
SNAPSHOT = 25
"""The snapshot each failure follows: the first past the durable step 20."""
RATE = "5mbps"
"""The durable store's link: 5 MB/s (tc's `mbps` is megabytes)."""
FLAGS = ("--train-iters", str(ITERS), "--save-interval", str(DURABLE))
STORAGE = "node3"
TRAINING = ("node1", "node2")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The digest of the same training uninterrupted on one node with 4 processes (same global batch)."""
    return final_digest(torchrun(tmp_path_factory.mktemp("reference") / "ckpt", *FLAGS, nproc=4))


@pytest.fixture(scope="module")
def store(nodes: Any) -> Iterator[Endpoint]:
    """S3 served from node 3, its port shaped to RATE each way (the rest of node 3's link, its NATS server's
    traffic, as fast as before)."""
    url = nodes.start_s3(STORAGE)
    nodes.throttle(STORAGE, RATE, port=int(url.rsplit(":", 1)[1]))
    try:
        yield Endpoint("moto", url, "testing", "testing", False)
    finally:
        nodes.unthrottle(STORAGE)


def sealed(nodes: Any, step: int) -> bool:
    """Whether every rank's part of snapshot `step` and every replica of it are sealed on the training nodes."""
    found = [p for n in TRAINING for p in nodes.memory(n).glob(f"ftrain-*/*/step-{step}/*/.complete")]
    return len(found) == 2 * 4


def forget(nodes: Any, node: str) -> None:
    """`node`'s memory lost, as a rebooted node's tmpfs is: its directory empty."""
    shutil.rmtree(nodes.memory(node))
    nodes.memory(node).mkdir(mode=0o700)


def job_processes(nodes: Any, run: str) -> list[int]:
    return [pid for node in TRAINING for pid in on(nodes, node, run, 1)]


def one_rank(nodes: Any, run: str) -> None:
    """Rank 3 (on node 2) SIGKILLed alone: its node's agent sees it die and ends the attempt."""
    os.kill(next(pid for pid in on(nodes, "node2", run, 1) if rank_of(pid) == 3), signal.SIGKILL)


def one_node(nodes: Any, run: str) -> None:
    """Node 2 lost whole: its link down, every process on it SIGKILLed (its NATS server too), its memory
    gone; then back, empty, as a rebooted node."""
    nodes.crash("node2")
    forget(nodes, "node2")
    nodes.heal("node2")
    nodes.start_nats("node2")


def both_memories(nodes: Any, run: str) -> None:
    """Every process of the job SIGKILLed and both nodes' memory lost: frozen first, so that nothing is written
    and no relaunch starts before the memory is gone."""
    frozen = job_processes(nodes, run)
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    for node in TRAINING:
        forget(nodes, node)
    for pid in frozen:
        os.kill(pid, signal.SIGKILL)


CASES: dict[str, tuple[Callable[[Any, str], None], str]] = {
    "rank": (one_rank, "memory"),
    "node": (one_node, "peer"),
    "memories": (both_memories, "durable"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_failure_resumes_from_the_tier_expected_bit_identical(
    nodes: Any, store: Endpoint, reference: str, case: str, tmp_path: Path
) -> None:
    fail, tier = CASES[case]
    run, bucket = f"dist-M{case}-2x2", store.new_bucket()
    watch = nodes.work / "shared" / f"memory-{case}"  # rank 0's metrics under watch/metrics
    env = {
        **nodes.nats_env(),
        **store.env(),
        "FTRAIN_STORAGE": f"s3://{bucket}/ckpt",
        "FTRAIN_STEP_DELAY": "0.3",  # time to act between snapshots, however loaded the machine
        "OMP_NUM_THREADS": "1",
        "TMPDIR": str(tmp_path),
    }
    argv = [FTRAIN, "run", f"M{case}", "--nodes", "2", "--gpus-per-node", "2", "--nodelist", "node[1-2]",
            "--node-exec", nodes.node_exec(), "--max-retries", "1", "--backoff", "1", "--",
            "-m", "ftrain.examples.train", *FLAGS, "--memory-every", str(EVERY), "--metrics-dir", str(watch / "metrics")]  # fmt: skip
    before = nodes.crossed(STORAGE)
    started = time.monotonic()
    job = supervisor(nodes, "node1", argv, env, tmp_path / "supervisor")
    try:
        wait_for(lambda: sealed(nodes, SNAPSHOT) and reached(watch) > SNAPSHOT, job, f"snapshot {SNAPSHOT}")
        killed_at = reached(watch)
        fail(nodes, run)
        assert job.wait(timeout=240) == 0, (tmp_path / "supervisor.err").read_text()[-3000:]
        wall = time.monotonic() - started
    finally:
        end_run(nodes, run, job)
    out = ended_with(tmp_path / "supervisor", reference)
    assert "Attempt 2 of 2 succeeded" in out, out

    seen = events(nodes, "node3", run, env)
    resumed = [e for e in seen if e["type"] == "resumed"][-1]  # the trainer's, after the supervisor's
    expected = DURABLE if tier == "durable" else SNAPSHOT
    assert (resumed.get("tier", "durable"), resumed["step"], resumed["attempt"]) == (tier, expected, 2), (
        summary(seen)
    )
    assert not any(e["type"] == "corrupt_skipped" for e in seen), summary(seen)
    lost = restarts(watch)[0]["train/lost_steps"]
    assert lost >= killed_at - expected, (lost, killed_at)
    if tier != "durable":
        assert lost <= EVERY, f"at most memory_every steps trained again from {tier}: {lost}"

    durable = sum(o["Size"] for o in store.client().list_objects_v2(Bucket=bucket).get("Contents", ()))
    crossed = nodes.crossed(STORAGE) - before
    assert crossed >= durable > 0, f"the durable traffic went through the shaped link: {crossed} < {durable}"
    print(f"\nmemory tier, {case} lost: resumed from {tier} at step {expected}, killed at step {killed_at}, "
          f"{lost} steps trained again, restart {restarts(watch)[0]['train/restart_seconds']:.1f} s; "
          f"{crossed / 1e6:.1f} MB over the {RATE} link; {wall:.1f} s wall; events: {summary(seen)}")  # fmt: skip
