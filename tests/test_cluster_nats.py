"""The event log on a 3-node NATS JetStream cluster across network namespaces (`scripts/cluster.py`): one
server per node, the stream replicated 3 ways, each node with its own FTRAIN_HOME and writer key (the others'
keys trusted as users would exchange them). The stream's leader killed mid-run: every acknowledged event
survives, appends go on from another node, and the audit, run from a third node, is intact."""

import json
import re
import subprocess
import sys
import time

import pytest

from tests.netns import FTRAIN, stream_leader
from tests.netns import cluster as harness

RUN = "dist-JPCP-2x2-fsdp"
pytestmark = pytest.mark.timeout(300)


def ftrain(nodes: "harness.Cluster", node: str, *args: str) -> tuple[int, str, str]:
    shared = nodes.work / "shared" / "ckpt"
    done = nodes.run(node, [FTRAIN, *args], {**nodes.nats_env(), "FTRAIN_STORAGE": str(shared)})
    return done.returncode, done.stdout, done.stderr


def checkpoint(nodes: "harness.Cluster", node: str, step: int) -> tuple[int, str, str]:
    state = json.dumps({"step": step})
    return ftrain(nodes, node, "checkpoint", RUN, "--step", str(step), "--epoch", "1", "--shards", "4",
                  "--state", state)  # fmt: skip


def test_the_stream_leader_killed_mid_run_loses_no_acknowledged_event(nodes: "harness.Cluster") -> None:
    code, out, err = ftrain(nodes, "node1", "launch", "JPCP", "--nodes", "2", "--gpus-per-node", "2",
                            "--nodelist", "node[1-2]")  # fmt: skip
    assert code == 0 and RUN in out, err
    acknowledged = []
    for step in (10, 20):
        code, out, err = checkpoint(nodes, "node1", step)
        assert code == 0, err
        acknowledged.append(step)
    leader = stream_leader(nodes)
    nodes.stop_nats(leader)
    writer = next(n for n in nodes.nodes if n not in (leader, "node1")) if leader == "node1" else "node2"
    for step in (30, 40):  # a new leader is elected; a command may wait for it, never loses its event
        code, out, err = checkpoint(nodes, writer, step)
        assert code == 0, err
        acknowledged.append(step)
    nodes.start_nats(leader)  # it comes back, catches up from the others
    auditor = next(n for n in nodes.nodes if n not in ("node1", writer))
    code, out, err = ftrain(nodes, auditor, "status", RUN)
    assert code == 0, err
    assert re.search(r"step\s+40 \(epoch 1\)", out), out
    code, out, err = ftrain(nodes, auditor, "audit", "verify")
    assert code == 0, out + err
    assert "intact" in out, out
    code, out, err = ftrain(nodes, auditor, "events", "tail", RUN, "--json")
    assert code == 0, err
    steps = [json.loads(line)["event"].get("step") for line in out.splitlines()
             if json.loads(line)["event"]["type"] == "checkpointed"]  # fmt: skip
    assert steps == acknowledged


RECORDER = """
import hashlib, os, sys
from events.schema import Checkpointed
from ftrain import settings
from projections.lifecycle import CheckpointIntent
from workers.recorder import Recorder

run, root, steps = sys.argv[1], sys.argv[2], [int(s) for s in sys.argv[3:]]
recorder = Recorder(run, settings.nats(os.environ), rank=0)
for step in steps:
    digest = hashlib.sha256(str(step).encode()).hexdigest()
    recorder.record(CheckpointIntent(checkpointed=Checkpointed(
        run_id=run, step=step, epoch=1, shards=4, uri=f"{root}/{run}/step-{step}", checkpoint_hash=digest,
        size_bytes=step, attempt=1)))
print("recorded", flush=True)
sys.stdin.readline()  # the link is back
print("delivered" if recorder.flush(60) else "pending", flush=True)
recorder.close()
"""


def said(proc: "subprocess.Popen[str]") -> str:
    """The recorder's next word on stdout (its log lines, also there, passed over)."""
    assert proc.stdout is not None
    while (line := proc.stdout.readline()) and line.strip() not in ("recorded", "delivered", "pending"):
        pass
    return line.strip()


def test_a_writer_cut_off_from_every_nats_node_buffers_and_lands_in_order_when_the_link_returns(
    nodes: "harness.Cluster",
) -> None:
    """After the leader test: node1 (where rank 0 would run) loses its link; what it records meanwhile waits in
    its outbox (recording never waits on the log), nothing reaches the log, and once the link is back every
    intent lands, in order; the audit from another node is intact."""
    shared = nodes.work / "shared" / "ckpt"
    env = {**nodes.nats_env(), "FTRAIN_STORAGE": str(shared)}
    nodes.cut("node1")
    try:
        proc = nodes.popen("node1", [sys.executable, "-c", RECORDER, RUN, shared.as_uri(), "50", "60", "70"],
                           env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert proc.stdout is not None and proc.stdin is not None
        started = time.monotonic()
        assert said(proc) == "recorded"
        assert time.monotonic() - started < 15, "recording waited on the log"
        deadline = time.monotonic() + 30  # the others elect a leader among themselves if node1's was it
        while (seen := ftrain(nodes, "node3", "status", RUN))[0] != 0 and time.monotonic() < deadline:
            time.sleep(1)
        assert seen[0] == 0 and re.search(r"step\s+40 ", seen[1]), seen  # nothing landed while cut off
    finally:
        nodes.heal("node1")
    proc.stdin.write("healed\n")
    proc.stdin.flush()
    assert said(proc) == "delivered"
    assert proc.wait(timeout=30) == 0
    code, out, err = ftrain(nodes, "node3", "events", "tail", RUN, "--json")
    assert code == 0, err
    steps = [json.loads(line)["event"].get("step") for line in out.splitlines()
             if json.loads(line)["event"]["type"] == "checkpointed"]  # fmt: skip
    assert steps == [10, 20, 30, 40, 50, 60, 70]
    code, out, err = ftrain(nodes, "node2", "audit", "verify")
    assert code == 0 and "intact" in out, out + err
