"""The `--json` object of each command that records something: one line on stdout. Every one names the run
(`run_id`), the event it recorded (`event_type`, its per-run `seq`, its `time`: RFC 3339, UTC) and what the
command's text line says, under the event's own field names. `status`, `list` and `cost` build theirs in
`queries`, `events tail` in `tail`, the servers' and keys' in their modules.
"""

from typing import TYPE_CHECKING, Any

from ftrain.domain.lifecycle import RunState
from ftrain.events.schema import AnyEvent, Checkpointed, Completed, CorruptSkipped, Failed, Launched, Resumed

if TYPE_CHECKING:  # the supervisor is `run`'s alone to load
    from ftrain.supervise.supervisor import Outcome


def _recorded(event: AnyEvent, kind: str) -> dict[str, Any]:
    return {"run_id": event.run_id, "event_type": kind, "seq": event.seq, "time": event.time}


def launched(event: Launched) -> dict[str, Any]:
    """`launch --json`: `project`, `strategy`, `nodes`, `procs_per_node`, `devices` ("gpu" or "cpu"),
    `hosts`, `rdzv_endpoint`, `command` (rank 0's torchrun argv), `storage`."""
    return {**_recorded(event, "launched"), "project": event.project, "strategy": event.strategy,
            "nodes": event.nodes, "procs_per_node": event.gpus_per_node,
            "devices": "cpu" if event.devices == "cpu" else "gpu", "hosts": event.hosts,
            "rdzv_endpoint": event.rdzv_endpoint, "command": event.command, "storage": event.storage}  # fmt: skip


def checkpointed(event: Checkpointed) -> dict[str, Any]:
    """`checkpoint --json`: `step`, `epoch`, `shards`, `uri`, `checkpoint_hash`, `size_bytes`."""
    return {**_recorded(event, "checkpointed"), "step": event.step, "epoch": event.epoch, "shards": event.shards,
            "uri": event.uri, "checkpoint_hash": event.checkpoint_hash, "size_bytes": event.size_bytes}  # fmt: skip


def resumed(event: Resumed, skipped: list[CorruptSkipped]) -> dict[str, Any]:
    """`resume --json`: `step`, `epoch`, `uri`, `checkpoint_hash` of the checkpoint resumed from,
    `resume_count`, `attempt` (the one it opens), `forced`, `command`, and `skipped`: the checkpoints refused
    on the way, newest first, each `{"step", "reason", "seq"}`."""
    return {**_recorded(event, "resumed"), "step": event.step, "epoch": event.epoch, "uri": event.uri,
            "checkpoint_hash": event.checkpoint_hash, "resume_count": event.resume_count,
            "attempt": event.attempt, "forced": event.forced, "command": event.command,
            "skipped": [{"step": s.step, "reason": s.reason, "seq": s.seq} for s in skipped]}  # fmt: skip


def failed(event: Failed, state: RunState) -> dict[str, Any]:
    """`fail --json`: `reason`, `exit_code` (null when not given), `message`, `failures` (the run's count)."""
    return {**_recorded(event, "failed"), "reason": event.reason, "exit_code": event.exit_code,
            "message": event.message, "failures": state.failures}  # fmt: skip


def completed(event: Completed, unit: str) -> dict[str, Any]:
    """`complete --json` (and `run --json`'s `completion`): `cost_hours` in `cost_unit` ("GPU-hours",
    "CPU-hours", "node-hours"), `cost_source` ("reported" or "wall-time"), `running_seconds`."""
    return {**_recorded(event, "completed"), "cost_hours": round(event.cost_gpu_hours, 6), "cost_unit": unit,
            "cost_source": event.cost_source, "running_seconds": round(event.running_seconds, 3)}  # fmt: skip


def run_outcome(
    run_id: str, outcome: "Outcome", attempt: int, completion: dict[str, Any] | None
) -> dict[str, Any]:
    """`run --json`, printed when supervision ends: `status` ("completed", "gave-up" or "stopped"),
    `exit_code` (ftrain's), `attempt` (the last one, as the log numbers it), `recorded` (false: the last
    event is still in the local outbox), `message` (why it did not complete; empty when it did) and
    `completion` (`complete --json`'s object; null unless completed and recorded)."""
    return {"run_id": run_id, "status": outcome.status, "exit_code": outcome.exit_code, "attempt": attempt,
            "recorded": outcome.recorded, "message": outcome.message, "completion": completion}  # fmt: skip
