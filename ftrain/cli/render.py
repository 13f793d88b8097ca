"""Human-readable lines for the CLI; the wording follows the product's reference documents.

Every line goes out through `emit` (`output`), which makes what the log's publishers wrote visible (`visible`): the
functions here format fields as they are stored and never escape them themselves.
"""

from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime

from ftrain.console.output import emit as emit
from ftrain.console.output import emit_json as emit_json
from ftrain.console.visible_text import visible
from ftrain.domain.chain_walk import Finding
from ftrain.domain.lifecycle import NodeCopy, RunState, SnapshotRef, rank_count, skipped_line
from ftrain.domain.vouching import Vouched
from ftrain.events.schema import (
    AnyEvent,
    Checkpointed,
    Completed,
    CorruptSkipped,
    DataPosition,
    Failed,
    Launched,
    Resumed,
    SnapshotReplicated,
    Snapshotted,
)
from ftrain.supervise.launch_spec import format_command


def timestamp(moment: datetime) -> str:
    """RFC 3339 in UTC, to the second: `2026-12-02T19:35:23Z`, the one form every view shows a time in."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def allocation(event: Launched) -> str:
    """`2×4 GPUs` or, for a CPU job, `1×2 processes on CPUs`."""
    what = "processes on CPUs" if event.devices == "cpu" else "GPUs"
    return f"{event.nodes}×{event.gpus_per_node} {what}"


def short_hash(digest: str) -> str:
    """The first four hex digits, as the reference output shows them."""
    return f"{digest[:4]}…"


def launched(event: Launched) -> list[str]:
    """`ftrain launch` output."""
    return [
        f"Launched {event.run_id} — {allocation(event)}, {event.strategy}, rdzv {event.rdzv_endpoint}",
        f"  {format_command(event.command)}",
    ]


def checkpointed(event: Checkpointed) -> str:
    """`ftrain checkpoint` output."""
    return (
        f"Checkpoint step {event.step} epoch {event.epoch} → {event.uri} "
        f"(hash {short_hash(event.checkpoint_hash)}, {event.shards} shard(s))"
    )


def skipped(event: CorruptSkipped) -> str:
    """One line per checkpoint a resume refused."""
    return skipped_line(event.step, event.reason)


def resumed(event: Resumed) -> list[str]:
    """`ftrain resume` output."""
    return [
        f"Resuming {event.run_id} from step {event.step} epoch {event.epoch} ({event.uri}) — "
        "optimizer state preserved.",
        f"  {format_command(event.command)}",
    ]


def failed(event: Failed, state: RunState) -> str:
    """`ftrain fail` output."""
    code = f", exit code {event.exit_code}" if event.exit_code is not None else ""
    return f"Marked {event.run_id} failed ({event.reason}{code}) — failure {state.failures}"


def completed(event: Completed, unit: str) -> str:
    """`ftrain complete` output: the cost in the run's unit (GPU-hours; a CPU job's CPU- or node-hours)."""
    per = {"GPU-hours": "GPUs", "CPU-hours": "CPUs", "node-hours": "nodes"}[unit]
    source = "reported" if event.cost_source == "reported" else f"running wall time × {per}"
    return f"Completed {event.run_id} — {event.cost_gpu_hours:.2f} {unit} ({source})"


def data_position(data: DataPosition, shards: int) -> str:
    """Where a checkpoint stands in the run's global sample stream, and the world that saved it."""
    return (
        f"epoch {data.epoch}, {data.offset} samples into it, {data.consumed} trained in all (seed "
        f"{data.seed}); saved by {rank_count(shards)}, resumable on any number"
    )


def status(state: RunState, moment: datetime) -> list[str]:
    """`ftrain status` output."""
    valid = next(iter(state.valid_checkpoints()), None)
    data = valid.recorded.data if valid is not None else None
    last = (
        f"step {valid.step} epoch {valid.epoch} {valid.uri} (hash {short_hash(valid.checkpoint_hash)})"
        if valid
        else "none"
    )
    launch = state.launch
    failures = f"{state.failures}" + (f" (last: {state.last_failure})" if state.last_failure else "")
    return [
        f"run         {state.run_id} (project {state.project})",
        f"state       {state.status}",
        f"step        {state.step} (epoch {state.epoch})",
        f"checkpoint  {last}",
        *(memory_lines(state.snapshot) if state.snapshot is not None else []),
        *(
            [f"data        {data_position(data, valid.recorded.shards)}"]
            if valid and isinstance(data, DataPosition)
            else []
        ),
        f"launch      {allocation(launch)}, {launch.strategy}, rdzv {launch.rdzv_endpoint}",
        *(
            [
                f"nodes       {', '.join(state.nodes)} ({len(state.nodes)} "
                + (
                    f"of {launch.nodes}"
                    if len(state.nodes) <= launch.nodes
                    else f"nodes, launched on {launch.nodes}"
                )
                + f": {state.gpus} "
                + ("processes)" if launch.devices == "cpu" else "GPUs)")
            ]
            if state.nodes != launch.hosts
            else []
        ),
        f"resumes     {state.resume_count}",
        f"failures    {failures}",
        f"launched    {timestamp(launch.time)}",
        f"updated     {timestamp(state.updated_at)}",
        f"{state.cost_unit.lower():<12}{state.cost_hours_at(moment):.2f}",
        f"chain head  seq {state.head.seq} {short_hash(state.head.hash)} (stream seq {state.head.stream_seq})",
    ]


def memory_snapshot(snapshot: SnapshotRef) -> str:
    """The `memory` line of `status`: the run's newest memory snapshot, on which node, and its state."""
    r = snapshot.recorded
    on = r.actor.host if r.actor is not None else "unknown node"
    refused = f", refused: {snapshot.reason}" if snapshot.status != "valid" else ""
    return f"step {r.step} epoch {r.epoch} on {on}, {r.size_bytes} bytes (hash {short_hash(r.checkpoint_hash)}){refused}"


def memory_lines(snapshot: SnapshotRef) -> list[str]:
    """The `memory` lines of `status`: the newest snapshot, then each node's part and its replica."""
    return [
        f"memory      {memory_snapshot(snapshot)}",
        *(f"{'  node ' + str(c.part.node):<12}{node_copy(c)}" for c in snapshot.nodes()),
    ]


def ranks(first: int, count: int) -> str:
    """`rank 3`, `ranks 0-3`."""
    return f"rank {first}" if count == 1 else f"ranks {first}-{first + count - 1}"


def replica(copy: NodeCopy) -> str:
    """Where a node's part of the snapshot is replicated and whether it landed there: `replica on node 1
    (gpu-b): landed`, `…: dropped (1 landed, 1 dropped, 0 failed)`, `…: pending`, or `no replica (one node)`."""
    if copy.replica == "none":
        return "no replica (one node)"
    on = f"node {copy.part.replica_node}" + (f" ({copy.replica_host})" if copy.replica_host else "")
    counts = copy.replicas
    detail = (
        f" ({counts.landed} landed, {counts.dropped} dropped, {counts.failed} failed)"
        if copy.replica == "dropped" and counts is not None
        else ""
    )
    return f"replica on {on}: {copy.replica}{detail}"


def node_copy(copy: NodeCopy) -> str:
    """One node's part of the snapshot: `gpu-a ranks 0-1, 2048 bytes; replica on node 1 (gpu-b): landed`."""
    part = copy.part
    return f"{part.host} {ranks(part.first_rank, part.ranks)}, {part.size_bytes} bytes; {replica(copy)}"


def table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    """Left-aligned columns, measured as they will be shown (escapes included)."""
    cells = [[visible(str(c)) for c in r] for r in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]


def finding(item: Finding) -> str:
    """One broken chain."""
    return f"BROKEN {item.describe()}"


def signers(by_run: dict[str, str | None]) -> str:
    """Who vouches for the runs: `; signed by alice@a (3 run(s)), unsigned, accepted (1 run(s))`."""
    counts = Counter(by_run.values())
    named = [f"{name or 'unsigned, accepted'} ({n} run(s))" for name, n in sorted(counts.items(), key=str)]
    return f"; signed by {', '.join(named)}" if named else ""


def vouched_by(vouched: Vouched | None) -> str:
    """The SIGNED BY column: the trusted writer, `unsigned, accepted`, or UNVOUCHED."""
    if vouched is None:
        return "UNVOUCHED"
    return vouched.signer or "unsigned, accepted"


def summary(event: AnyEvent) -> str:
    """The gist of an event, for `replay`."""
    if isinstance(event, Launched):
        return f"{allocation(event)} {event.strategy} rdzv {event.rdzv_endpoint}"
    if isinstance(event, Checkpointed | Snapshotted):
        return f"step {event.step} epoch {event.epoch} hash {short_hash(event.checkpoint_hash)} {event.uri}"
    if isinstance(event, SnapshotReplicated):
        landed = sum(r.landed for r in event.replicas)
        of = sum(r.landed + r.dropped + r.failed for r in event.replicas)
        return f"step {event.step} (snapshot seq {event.snapshot_seq}): {landed} of {of} replicas landed"
    if isinstance(event, Failed):
        return event.reason + (f" exit {event.exit_code}" if event.exit_code is not None else "")
    if isinstance(event, Resumed):
        on = f" on {', '.join(event.hosts)}" if isinstance(event.hosts, tuple) else ""
        tier = f" from {event.tier}" if isinstance(event.tier, str) else ""
        return f"#{event.resume_count} from step {event.step}{tier}{on}" + (
            " (while the log still saw it running)" if event.forced else ""
        )
    if isinstance(event, CorruptSkipped):
        tier = f" ({event.tier})" if isinstance(event.tier, str) else ""
        return f"step {event.step}{tier}: {event.reason}"
    return f"cost {event.cost_gpu_hours:.2f} ({event.cost_source}; in the run's unit, as launched)"
