"""Training across nodes for real: `ftrain run --node-exec` over two network-namespace nodes (2 CPU processes
each, gloo, the reference trainer's debug model), the log on the 3-node NATS cluster, checkpoints on a directory
both nodes share (as NFS would), each node with its own FTRAIN_HOME and writer key. An uninterrupted run; a node
lost mid-run and back; a NATS server killed, then rank 0's node cut off from NATS, while the run trains; an old
attempt frozen on a node cut off, continued while its relaunch trains, with rank 0 on a node the supervisor does
not run on. Each test leaves the cluster as it found it."""

import contextlib
import json
import os
import signal
import subprocess
import time
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from ftrain.domain.lifecycle import CheckpointIntent
from ftrain.supervise.procs import attempt_processes, end_attempt
from ftrain.workers.layout import MARKER, complete_steps, set_asides
from ftrain.workers.manifest import decode_marker
from ftrain.workers.outbox import Outbox, outbox_path
from ftrain.workers.storage.file.fence_file import owner
from tests.support.netns import FTRAIN, stream_leader
from tests.support.processes import run_marks
from tests.support.training import alive, final_digest, is_relay, stopped, torchrun, wait_for

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
    assert "Completed dist-P-2x2 " in done.stdout
    seen = events(nodes, "node2", "dist-P-2x2", env)
    assert [e["type"] for e in seen] == ["launched", *["checkpointed"] * 4, "completed"]
    assert [e["step"] for e in seen if e["type"] == "checkpointed"] == [5, 10, 15, 20]
    print(f"2-node run: {wall:.1f} s wall")


def supervisor(
    nodes: Any, node: str, argv: list[str], env: dict[str, str], out: Path
) -> subprocess.Popen[bytes]:
    """`ftrain run …` on `node`, in a session of its own, its output in `out`.{out,err}."""
    return nodes.popen(node, argv, env, stdout=out.with_suffix(".out").open("wb"),
                       stderr=out.with_suffix(".err").open("wb"), start_new_session=True)  # fmt: skip


def ftrain_run(nodes: Any, project: str, hosts: str, *options: str) -> list[str]:
    return [FTRAIN, "run", project, "--nodes", "2", "--gpus-per-node", "2", "--nodelist", hosts,
            "--node-exec", nodes.node_exec(), *options, "--", *TRAIN]  # fmt: skip


def on(nodes: Any, node: str, run: str, attempt: int) -> list[int]:
    """The processes of `attempt` of `run` on `node` (found by their network namespace and environment)."""
    return sorted(set(nodes.pids(node)) & set(attempt_processes(run_marks(run, attempt))))


def trained(ckpt: Path) -> list[dict[str, Any]]:
    """Rank 0's metrics so far (a line being written is left for the next look)."""
    path = ckpt / "metrics" / "metrics-0.jsonl"
    lines = path.read_bytes().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.endswith(b"}")]


def reached(ckpt: Path) -> int:
    return max((m["train/iter"] for m in trained(ckpt)), default=0)


def restarts(ckpt: Path) -> list[dict[str, Any]]:
    return [m for m in trained(ckpt) if "train/restart_seconds" in m]


def summary(seen: list[dict[str, Any]]) -> str:
    """`launched@1 checkpointed:5@1 failed:node-failure@1 …` (type, step or reason, attempt)."""
    words = []
    for e in seen:
        detail = e.get("step") if e["type"] in ("checkpointed", "resumed") else e.get("reason")
        words.append(e["type"] + (f":{detail}" if detail is not None else "") + f"@{e.get('attempt', 1)}")
    return " ".join(words)


def since(event: dict[str, Any], moment: float) -> float:
    """Seconds from `moment` (time.time()) to the event's time."""
    return datetime.fromisoformat(event["time"]).timestamp() - moment


def end_run(nodes: Any, run: str, *procs: subprocess.Popen[bytes]) -> None:
    """Leave the cluster as the fixture made it: every process of the run gone, links up, NATS on every node
    and reachable from every node."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for attempt in (1, 2, 3):
        assert not end_attempt(run_marks(run, attempt), 10)  # stopped ones too
    for node in nodes.nodes:
        nodes.heal(node)
        nodes.heal_nats(node)
        if node not in nodes.nats:
            nodes.start_nats(node)


def ended_with(out: Path, digest: str) -> str:
    """What the supervisor writing `out`.out printed, once its run ended with `digest`."""
    said = out.with_suffix(".out").read_text()
    assert final_digest(subprocess.CompletedProcess([], 0, said, "")) == digest
    return said


def test_a_lost_node_is_recorded_and_the_run_resumes_on_both_nodes_when_it_returns(
    nodes: Any, one_node_digest: str, tmp_path: Path
) -> None:
    """Node 2 fails as a machine does (link down, every process on it SIGKILLed, its NATS server too): the
    supervisor on node 1 records `failed` (node-failure, naming node2) and relaunches on both nodes; the
    rendezvous waits until node 2 is back, and the run ends with the uninterrupted digest."""
    run, ckpt_root = "dist-L-2x2", nodes.work / "shared" / "ckpt-lost"
    ckpt, env = ckpt_root / run, run_env(nodes, ckpt_root)
    started = time.monotonic()
    job = supervisor(nodes, "node1", ftrain_run(nodes, "L", "node[1-2]", "--max-retries", "1", "--backoff", "1"),
                     env, tmp_path / "supervisor")  # fmt: skip
    try:
        wait_for(lambda: reached(ckpt) >= 7, job, "step 7")
        crashed, crashed_at = time.monotonic(), time.time()
        nodes.crash("node2")
        wait_for(lambda: bool(on(nodes, "node2", run, 2)), job, "the relaunch to start on node2", timeout=60)
        time.sleep(2)  # node 2 is still cut off: the rendezvous on node 1 waits for it
        assert not restarts(ckpt)
        nodes.heal("node2")
        healed = time.monotonic()
        nodes.start_nats("node2")
        wait_for(lambda: bool(restarts(ckpt)), job, "training to go on", timeout=90)
        restarted = time.monotonic()
        assert job.wait(timeout=120) == 0, (tmp_path / "supervisor.err").read_text()[-3000:]
        wall = time.monotonic() - started
    finally:
        end_run(nodes, run, job)
    out = ended_with(tmp_path / "supervisor", one_node_digest)
    assert "Attempt 1 of 2 failed (node node2 lost: its command was killed by SIGKILL)" in out, out
    assert "Attempt 2 of 2 succeeded" in out, out
    seen = events(nodes, "node3", run, env)
    failed = next(i for i, e in enumerate(seen) if e["type"] == "failed")
    lost = seen[failed]
    assert (lost["reason"], lost["exit_code"], lost["attempt"]) == ("node-failure", 137, 1)
    assert lost["message"] == "node node2 lost: its command was killed by SIGKILL"
    before = [e["step"] for e in seen[:failed] if e["type"] == "checkpointed"]
    assert before and before == list(range(5, before[-1] + 1, 5))
    assert seen[failed + 1]["type"] == "resumed" and seen[failed + 1]["step"] == before[-1]
    assert [(e["type"], e.get("step")) for e in seen[failed + 2 :]] == [
        *[("checkpointed", s) for s in range(before[-1] + 5, 21, 5)], ("completed", None)]  # fmt: skip
    assert {e["attempt"] for e in seen[failed + 1 :]} == {2}
    first = restarts(ckpt)[0]
    print(f"\nscenario 2 (node lost): {wall:.1f} s wall; after the crash: `failed` in the log at "
          f"{since(lost, crashed_at):.1f} s, `resumed` at {since(seen[failed + 1], crashed_at):.1f} s, node2 back at "
          f"{healed - crashed:.1f} s, training again at {restarted - crashed:.1f} s ({restarted - healed:.1f} s after "
          f"node2 came back; trainer restart_seconds {first['train/restart_seconds']:.1f}, lost steps "
          f"{first['train/lost_steps']}); events: {summary(seen)}")  # fmt: skip


def test_with_min_nodes_a_lost_node_is_dropped_and_taken_back_once_it_reaches_the_log_again(
    nodes: Any, tmp_path: Path
) -> None:
    """Node 2 is lost under `--min-nodes 1`: the supervisor records `failed` (node-failure) and opens attempt 2
    on node1 alone, whose 2 processes load the 4-rank checkpoint resharded by DCP and train on. Node 2 comes
    back (link up, its NATS server again) while attempt 2 trains; attempt 2 is killed at step 17
    (FTRAIN_KILL_AT), and its relaunch asks node2 whether it reaches the log: it does, and attempt 3 trains on
    both nodes to the end. The events say the world each time: launched on 2 nodes × 2, checkpoints of 4
    shards; `resumed` on node1, checkpoints of 2 shards; `resumed` on both, 4 shards again."""
    run, ckpt_root = "dist-E-2x2", nodes.work / "shared" / "ckpt-elastic"
    ckpt = ckpt_root / run
    env = {
        **run_env(nodes, ckpt_root),
        "FTRAIN_KILL_AT": "step:17",
        "FTRAIN_KILL_ONCE": str(tmp_path / "kills"),
    }
    started = time.monotonic()
    job = supervisor(nodes, "node1", ftrain_run(nodes, "E", "node[1-2]", "--min-nodes", "1", "--max-retries", "2",
                                                "--backoff", "1"), env, tmp_path / "supervisor")  # fmt: skip
    try:
        wait_for(lambda: reached(ckpt) >= 7, job, "step 7")
        crashed, crashed_at = time.monotonic(), time.time()
        nodes.crash("node2")
        wait_for(lambda: bool(on(nodes, "node1", run, 2)), job, "attempt 2 to start on node1", timeout=90)
        nodes.heal("node2")
        nodes.start_nats("node2")
        assert job.wait(timeout=300) == 0, (tmp_path / "supervisor.err").read_text()[-3000:]
        wall, ended = time.monotonic() - started, time.monotonic()
    finally:
        end_run(nodes, run, job)
    out = (tmp_path / "supervisor.out").read_text()
    assert "going on without node2 (--min-nodes 1): 1 node(s), node1; retrying in 1 s" in out, out
    assert "taking back node2 (answering again): 2 node(s), node1, node2; retrying in 2 s" in out, out
    assert "Attempt 3 of 3 succeeded" in out and reached(ckpt) == 20, out
    seen = events(nodes, "node3", run, env)
    failures = [i for i, e in enumerate(seen) if e["type"] == "failed"]
    assert len(failures) == 2, summary(seen)
    lost, shrunk, grown = seen[failures[0]], seen[failures[0] + 1], seen[failures[1] + 1]
    assert (lost["reason"], lost["message"]) == (
        "node-failure",
        "node node2 lost: its command was killed by SIGKILL",
    )
    assert (seen[0]["nodes"], seen[0]["gpus_per_node"], seen[0]["hosts"]) == (2, 2, ["node1", "node2"])
    assert (shrunk["type"], shrunk["hosts"], shrunk["attempt"]) == ("resumed", ["node1"], 2)
    assert (grown["type"], grown["hosts"], grown["attempt"]) == ("resumed", ["node1", "node2"], 3)
    assert [(e["saved_world"], e["world"]) for e in (shrunk, grown)] == [(4, 2), (2, 4)]  # the world said
    shards = [(e["step"], e["shards"]) for e in seen if e["type"] == "checkpointed"]
    assert shards == [(s, 4 if s <= shrunk["step"] or s > grown["step"] else 2) for s in range(5, 21, 5)]
    assert grown["step"] == 15 and seen[-1]["type"] == "completed" and seen[-1]["attempt"] == 3
    status = nodes.run("node3", [FTRAIN, "status", run], env)
    assert status.returncode == 0 and "\nnodes " not in status.stdout, status.stdout + status.stderr
    first = restarts(ckpt)[0]
    print(f"\nscenario 3 (elastic, node2 lost and back): {wall:.1f} s wall; after the crash: `failed` in the log at "
          f"{since(lost, crashed_at):.1f} s, `resumed` on node1 at {since(shrunk, crashed_at):.1f} s, on both again "
          f"at {since(grown, crashed_at):.1f} s, the run ended {ended - crashed:.1f} s after it (trainer "
          f"restart_seconds {first['train/restart_seconds']:.1f}, lost steps {first['train/lost_steps']}); world "
          f"4 → 2 → 4; events: {summary(seen)}")  # fmt: skip


def waiting(outbox: Outbox, run: str) -> list[int]:
    """The steps whose `checkpointed` waits in `outbox`, oldest first."""
    return [p.intent.checkpointed.step for p in outbox.pending(run) if isinstance(p.intent, CheckpointIntent)]


def longest_step(ckpt: Path) -> float:
    """The longest time between two of rank 0's steps, its saves included."""
    times = [m["time"] for m in trained(ckpt) if "train/loss" in m]
    return max(b - a for a, b in pairwise(times))


def test_the_log_losing_a_server_or_rank_0s_node_never_holds_training_and_loses_nothing(
    nodes: Any, one_node_digest: str, tmp_path: Path
) -> None:
    """While two nodes train (each step slowed by about 1 s, FTRAIN_STEP_DELAY, to leave time to act), the
    stream's leader server is SIGKILLed: training goes on and step 5's event lands once the others elect a
    leader; the server comes back. Then node1, where the supervisor and rank 0 run, is cut off from every NATS
    server while its link, and the training over it, stay up: its saves wait in its outbox and nothing lands;
    once it is back they land, in order. The events are exact, the audit from another node is intact, and the
    digest is the uninterrupted one."""
    run, root = "dist-N-2x2", nodes.work / "shared" / "ckpt-nats"
    ckpt, env = root / run, run_env(nodes, root)
    outbox = Outbox(outbox_path(nodes.home("node1")))  # shared with the node's supervisor and rank 0
    started = time.monotonic()
    job = supervisor(nodes, "node1", ftrain_run(nodes, "N", "node[1-2]", "--max-retries", "0"),
                     {**env, "FTRAIN_STEP_DELAY": "1"}, tmp_path / "supervisor")  # fmt: skip
    try:
        wait_for(lambda: reached(ckpt) >= 2, job, "step 2")
        leader = stream_leader(nodes)
        nodes.stop_nats(leader)
        killed, killed_at = time.monotonic(), reached(ckpt)
        wait_for(lambda: reached(ckpt) >= 6 and not outbox.pending(run), job,
                 "step 5's event to land without the leader", timeout=60)  # fmt: skip
        nodes.start_nats(leader)
        back, back_at = time.monotonic(), reached(ckpt)
        wait_for(lambda: reached(ckpt) >= 7, job, "step 7")
        nodes.cut_nats("node1")
        cut, cut_at = time.monotonic(), reached(ckpt)
        assert cut_at < 10, f"step {cut_at} at the cut: the run went faster than the test"
        wait_for(lambda: waiting(outbox, run) == [10, 15], job, "steps 10 and 15 to wait in node1's outbox")
        meanwhile = events(nodes, "node3", run, env)
        buffered = waiting(outbox, run)
        nodes.heal_nats("node1")
        healed, healed_at = time.monotonic(), reached(ckpt)
        wait_for(lambda: not outbox.pending(run), job, "node1's outbox to empty", timeout=60)
        landed = time.monotonic()
        assert job.wait(timeout=120) == 0, (tmp_path / "supervisor.err").read_text()[-3000:]
        wall = time.monotonic() - started
    finally:
        outbox.close()
        end_run(nodes, run, job)
    out = (tmp_path / "supervisor.out").read_text()
    assert final_digest(subprocess.CompletedProcess([], 0, out, "")) == one_node_digest
    assert summary(meanwhile) == "launched@1 checkpointed:5@1"  # nothing of node1's while it was cut off
    seen = events(nodes, "node3", run, env)
    assert summary(seen) == ("launched@1 checkpointed:5@1 checkpointed:10@1 checkpointed:15@1 checkpointed:20@1 "
                             "completed@1")  # fmt: skip
    # recorded by rank 0 on node1, whichever process of node1 (rank 0, or the supervisor sharing its outbox)
    # reached the log first after the heal: the events name who recorded them
    assert {(e["actor"]["host"], e["actor"].get("rank")) for e in seen if e["type"] == "checkpointed"} == {
        ("node1", 0)
    }
    audit = nodes.run("node2", [FTRAIN, "audit", "verify"], env)
    assert audit.returncode == 0 and "intact" in audit.stdout, audit.stdout + audit.stderr
    stalls = [round(e["stall_seconds"], 1) for e in seen if e["type"] == "checkpointed"]
    longest = longest_step(ckpt)
    assert longest < 5, longest  # a step that waited on the log would have lasted the cut (≥ 8 steps' time)
    print(f"\nscenario 5 (a NATS server killed, rank 0's node cut off from NATS): {wall:.1f} s wall; leader "
          f"{leader} down {back - killed:.1f} s (steps {killed_at}→{back_at}); node1 cut off from NATS "
          f"{healed - cut:.1f} s (steps {cut_at}→{healed_at}), `checkpointed` {buffered} waiting in its outbox, "
          f"in the log {landed - healed:.1f} s after; longest step {longest:.1f} s, save stalls {stalls} s; "
          f"events: {summary(seen)}")  # fmt: skip


def frozen(nodes: Any, node: str, run: str) -> bool:
    """Whether attempt 1's processes on `node` (torchrun's agent and its two ranks) are all stopped."""
    procs = [pid for pid in on(nodes, node, run, 1) if not is_relay(pid)]
    return len(procs) == 3 and all(stopped(pid) for pid in procs)


def rank_of(pid: int) -> int | None:
    """The training rank a process of a job is (None: torchrun's agent)."""
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return next((int(v[5:]) for v in env if v.startswith(b"RANK=")), None)


def sealed_by(ckpt: Path, step: int) -> int | None:
    """The attempt that sealed `step-<step>` (None: not sealed)."""
    try:
        return decode_marker((ckpt / f"step-{step}" / MARKER).read_bytes()).attempt
    except FileNotFoundError:
        return None


def test_a_partitioned_old_attempt_writes_nothing_the_run_accepts(
    nodes: Any, one_node_digest: str, tmp_path: Path
) -> None:
    """The supervisor runs on node2 and rank 0 on node1 (c10d orders node ranks by host name), each node with its
    own FTRAIN_HOME. Rank 0 seals step 10 and its node freezes before recording it (FTRAIN_STOP_AT), and is cut
    off. The scheduler, having declared node1 down, kills the job on the nodes it reaches; its epilogue records
    the failure, and the job is requeued on node[2-3] (`ftrain run --run-id` from node3). While that attempt
    trains, node1 comes back: its rank 0 records step 10 of attempt 1, which the log refuses, and stops at the
    checkpoint directory's fence; the step it sealed was set aside by the relaunch, which ends with the
    uninterrupted digest."""
    run, root = "dist-Z-2x2", nodes.work / "shared" / "ckpt-zombie"
    ckpt, env = root / run, run_env(nodes, root)
    started = time.monotonic()
    job = supervisor(nodes, "node2", ftrain_run(nodes, "Z", "node[1-2]", "--max-retries", "0"),
                     {**env, "FTRAIN_STOP_AT": "sealed:10"}, tmp_path / "first")  # fmt: skip
    relaunch = job
    try:
        wait_for(lambda: frozen(nodes, "node1", run), job, "node1 to freeze after sealing step 10")
        old = on(nodes, "node1", run, 1)
        nodes.cut("node1")
        froze = time.monotonic()
        for pid in [job.pid, *(p for p in nodes.pids("node2") if p != nodes.nats["node2"])]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # the supervisor first: nothing of it reaches node1
        job.wait()
        wait_for(lambda: not on(nodes, "node2", run, 1), None, "node2's part of the job to die", timeout=10)
        failed = nodes.run("node3", [FTRAIN, "fail", run, "--reason", "node-failure", "--message",
                                     "node node1 declared down by the scheduler"], env)  # fmt: skip
        assert failed.returncode == 0, failed.stderr
        relaunch = supervisor(nodes, "node3", ftrain_run(nodes, "Z", "node[2-3]", "--run-id", run,
                                                         "--max-retries", "0"), env, tmp_path / "relaunch")  # fmt: skip
        wait_for(lambda: sealed_by(ckpt, 10) == 2, relaunch, "the relaunch to seal step 10")
        nodes.heal("node1")
        woken = time.monotonic()
        rank0 = next(pid for pid in old if rank_of(pid) == 0)
        os.kill(rank0, signal.SIGCONT)  # rank 0 first: its rank 1 may fail on the dead peers once it runs
        wait_for(lambda: not alive(rank0), None, "the old rank 0 to stop", timeout=60)
        for pid in old:
            os.kill(pid, signal.SIGCONT)
        wait_for(lambda: not on(nodes, "node1", run, 1), None, "the old attempt to end", timeout=60)
        ended = time.monotonic()
        assert relaunch.wait(timeout=180) == 0, (tmp_path / "relaunch.err").read_text()[-3000:]
        relaunched = time.monotonic()
    finally:
        end_run(nodes, run, job, relaunch)
    out = (tmp_path / "relaunch.out").read_text()
    assert final_digest(subprocess.CompletedProcess([], 0, out, "")) == one_node_digest
    assert f"Relaunching {run}" in out and f"Completed {run}" in out, out

    outbox = Outbox(outbox_path(nodes.home("node1")))  # what node1's rank 0 tried to record when it woke
    try:
        assert outbox.pending(run) == []
        refused = outbox.rejected(run)
    finally:
        outbox.close()
    assert [(r.intent.checkpointed.step, r.intent.checkpointed.attempt) for r in refused] == [(10, 1)], (
        refused
    )

    seen = events(nodes, "node3", run, env)
    assert summary(seen) == ("launched@1 checkpointed:5@1 failed:node-failure@1 resumed:5@2 checkpointed:10@2 "
                             "checkpointed:15@2 checkpointed:20@2 completed@2")  # fmt: skip
    hosts = [(e["type"], e["actor"]["host"], e["actor"].get("rank")) for e in seen]
    assert hosts == [("launched", "node2", None), ("checkpointed", "node1", 0), ("failed", "node3", None),
                     ("resumed", "node3", None), *[("checkpointed", "node2", 0)] * 3, ("completed", "node3", None)]  # fmt: skip

    assert complete_steps(ckpt) == [20, 15, 10] and owner(ckpt) == 2
    assert [sealed_by(ckpt, s) for s in (10, 15, 20)] == [2, 2, 2]
    aside = set_asides(ckpt)
    assert [(a.step, a.kind) for a in aside] == [(10, "unrecorded")]
    assert decode_marker((aside[0].path / MARKER).read_bytes()).attempt == 1
    first = restarts(ckpt)[0]
    print(f"\nscenario 6 (partitioned old attempt; rank 0 off the supervisor's node): "
          f"{relaunched - started:.1f} s wall; node1 froze {froze - started:.1f} s in; the relaunch on "
          f"node[2-3] ended {relaunched - froze:.1f} s later (trainer restart_seconds "
          f"{first['train/restart_seconds']:.1f}, lost steps {first['train/lost_steps']}); woken while it trained, the "
          f"old attempt ended in {ended - woken:.1f} s, its `checkpointed` refused ({refused[0].reason}); "
          f"events: {summary(seen)}")  # fmt: skip
