"""Training across nodes for real: `ftrain run --node-exec` over two network-namespace nodes (2 CPU processes
each, gloo, the reference trainer's debug model), the log on the 3-node NATS cluster, checkpoints on a directory
both nodes share (as NFS would), each node with its own FTRAIN_HOME and writer key."""

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.netns import FTRAIN
from tests.training import final_digest, torchrun

pytestmark = pytest.mark.timeout(600)
TRAIN = ("-m", "ftrain.examples.train", "--train-iters", "20", "--save-interval", "5")


@pytest.fixture(scope="module")
def one_node_digest(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The same training on one node with 4 processes: the same global batch and data order."""
    return final_digest(torchrun(tmp_path_factory.mktemp("one-node") / "ckpt", *TRAIN[2:], nproc=4))


def run_env(nodes: Any, storage: Path) -> dict[str, str]:
    return {**nodes.nats_env(), "FTRAIN_STORAGE": str(storage), "OMP_NUM_THREADS": "1"}


def events(nodes: Any, node: str, run: str, env: dict[str, str]) -> list[dict[str, Any]]:
    done = nodes.run(node, [FTRAIN, "events", "tail", run, "--json"], env)
    assert done.returncode == 0, done.stderr
    return [json.loads(line)["event"] for line in done.stdout.splitlines()]


def test_a_two_node_run_completes_with_the_one_node_digest(nodes: Any, one_node_digest: str) -> None:
    env = run_env(nodes, nodes.work / "shared" / "ckpt-a")
    started = time.monotonic()
    done = nodes.run("node1", [FTRAIN, "run", "P", "--nodes", "2", "--gpus-per-node", "2", "--nodelist",
                               "node[1-2]", "--node-exec", nodes.node_exec(), "--max-retries", "0", "--", *TRAIN],
                     env, timeout=300)  # fmt: skip
    wall = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert final_digest(done) == one_node_digest
    assert "Completed dist-P-2x2-fsdp" in done.stdout
    seen = events(nodes, "node2", "dist-P-2x2-fsdp", env)
    assert [e["type"] for e in seen] == ["launched", *["checkpointed"] * 4, "completed"]
    assert [e["step"] for e in seen if e["type"] == "checkpointed"] == [5, 10, 15, 20]
    print(f"2-node run: {wall:.1f} s wall")
