"""The read-only commands: status, list, cost (per project, or one run's goodput), audit verify, replay.
Each prints lines for a person, or with `--json` one JSON document (its keys in each builder's docstring).
Their parser: `query_cmd`."""

import argparse
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import msgspec
import nats.errors

from ftrain.cli import goodput_view, render
from ftrain.domain.lifecycle import CheckpointRef, NodeCopy, RunState, SnapshotRef
from ftrain.errors import NotFound
from ftrain.events.jetstream.lease import LeaseView
from ftrain.events.lease_record import held_for
from ftrain.events.log_port import LogUnavailable
from ftrain.events.schema import now
from ftrain.service import RunService
from ftrain.service.run_queries import RunView

# -- queries ---------------------------------------------------------------------------------------------------


def checkpoint_document(ref: CheckpointRef) -> dict[str, Any]:
    """A checkpoint in `status --json`: the fields of the event that recorded it, its status and reason."""
    r = ref.recorded
    return {"seq": r.seq, "step": r.step, "epoch": r.epoch, "shards": r.shards, "uri": r.uri,
            "checkpoint_hash": r.checkpoint_hash, "size_bytes": r.size_bytes, "time": r.time,
            "status": ref.status, "reason": ref.reason}  # fmt: skip


def snapshot_document(ref: SnapshotRef) -> dict[str, Any]:
    """The newest memory snapshot in `status --json`: its event's fields, the node that recorded it, its
    status and reason, and `nodes`: each node's part and its replica (`node_document`; empty when the event
    names no parts)."""
    r = ref.recorded
    return {"seq": r.seq, "step": r.step, "epoch": r.epoch, "shards": r.shards, "uri": r.uri,
            "host": r.actor.host if r.actor else None, "checkpoint_hash": r.checkpoint_hash,
            "size_bytes": r.size_bytes, "time": r.time, "status": ref.status, "reason": ref.reason,
            "nodes": [node_document(c) for c in ref.nodes()]}  # fmt: skip


def node_document(copy: NodeCopy) -> dict[str, Any]:
    """One node's part of the snapshot: `node` (its rank among the nodes), `host`, `first_rank`, `ranks`,
    `size_bytes`, `replica_node` and `replica_host` (null: no replica), `replica` (`landed`, `dropped`,
    `pending` or `none`) and, once the exchange ended, `landed`, `dropped`, `failed` (its ranks' replicas;
    null before)."""
    part, counts = copy.part, copy.replicas
    return {"node": part.node, "host": part.host, "first_rank": part.first_rank, "ranks": part.ranks,
            "size_bytes": part.size_bytes, "replica_node": part.replica_node, "replica_host": copy.replica_host,
            "replica": copy.replica, "landed": counts and counts.landed, "dropped": counts and counts.dropped,
            "failed": counts and counts.failed}  # fmt: skip


def view_document(view: RunView, *, whole: bool = True) -> dict[str, Any]:
    """A run in `status --json` and `list --json`: its status document, or only its name when none of its
    events was accepted; a broken or unvouched run's `state` is "broken" and `broken` carries the finding
    (for an unvouched one: its first event no trusted writer vouches for, and why). `vouched`: whether a
    trusted writer vouches for the run (or it is an unsigned log accepted); `signed_by`: that writer. Not
    `whole` (a `list` row): without the launch event and the list of every checkpoint, which grow with the
    run, but with `last_valid_checkpoint`."""
    doc: dict[str, Any] = status_document(view.state) if view.state else {"run_id": view.run_id}
    if not whole:
        doc.pop("launch", None)
        doc.pop("checkpoints", None)
    if view.broken is not None:
        doc["state"] = "broken"
    doc["broken"] = view.broken
    doc["vouched"] = view.vouched is not None
    doc["signed_by"] = view.vouched.signer if view.vouched else None
    if view.goodput is not None:
        doc["goodput"] = goodput_view.document(view.goodput)
    return doc


def status_document(state: RunState) -> dict[str, Any]:
    """`status --json`: the folded state plus derived figures."""
    moment = now()
    valid = next(iter(state.valid_checkpoints()), None)
    return {
        "run_id": state.run_id,
        "project": state.project,
        "state": state.status,
        "step": state.step,
        "epoch": state.epoch,
        "last_valid_checkpoint": valid and checkpoint_document(valid),
        "memory_snapshot": state.snapshot and snapshot_document(state.snapshot),
        "resume_count": state.resume_count,
        "failures": state.failures,
        "last_failure": state.last_failure,
        "gpu_hours": round(state.gpu_hours_at(moment), 6),
        "cost_hours": round(state.cost_hours_at(moment), 6),
        "cost_unit": state.cost_unit,
        "running_seconds": round(state.running_seconds_at(moment), 3),
        "launched_at": state.launch.time,
        "updated_at": state.updated_at,
        "chain_head": state.head,
        "checkpoints": [checkpoint_document(c) for c in state.checkpoints],
        "launch": state.launch,
        "nodes": state.nodes,
        "gpus": state.gpus,
    }


async def supervisor_of(app: RunService, run_id: str) -> LeaseView | str:
    """The run's supervisor lease, or why it could not be read (the status is shown all the same)."""
    try:
        return await app.lease(run_id)
    except (LogUnavailable, nats.errors.Error) as exc:
        return f"unknown ({type(exc).__name__})"


def supervisor_document(lease: LeaseView | str) -> dict[str, Any]:
    """`supervisor` in `status --json`: whether its lease is live, its holder (the last one once expired;
    null: never leased), and how long ago it renewed by the holder's clock; or why it is unknown."""
    if isinstance(lease, str):
        return {"unknown": lease}
    holder = lease.holder
    age = None if holder is None else round(max((now() - holder.renewed).total_seconds(), 0.0), 3)
    return {"live": lease.live, "holder": holder, "renewed_seconds_ago": age}


def supervisor_line(lease: LeaseView | str) -> str:
    """The `supervisor` line of `status`."""
    if isinstance(lease, str):
        said = lease
    elif lease.live:
        said = held_for(lease.holder)
    elif lease.holder is not None:
        said = f"none: its lease expired (last held by {held_for(lease.holder)})"
    else:
        said = "none leased"
    return f"supervisor  {said}"


async def run_status(app: RunService, args: argparse.Namespace, _: None) -> int:
    """One run, with its supervisor's lease; exit 1 when its chain is broken."""
    view = await app.view(args.run_id)
    lease = await supervisor_of(app, args.run_id)
    if args.json:
        render.emit_json({**view_document(view), "supervisor": supervisor_document(lease)})
    else:
        if view.broken is not None:  # first: what the rest shows is only the state before the break
            render.emit(render.finding(view.broken))
        if view.state is not None:
            *lines, head = render.status(view.state, now())
            if view.goodput is not None:
                lines.append(goodput_view.status_line(view.goodput))
            render.emit([*lines, supervisor_line(lease), head])
    return 0 if view.broken is None else 1


async def run_list(app: RunService, args: argparse.Namespace, _: None) -> int:
    """Runs, optionally of one project; a broken or unvouched run shows as BROKEN, and SIGNED BY says who
    vouches for each (UNVOUCHED: no trusted writer)."""
    views = await app.views(args.project)
    if args.json:
        render.emit_json([view_document(v, whole=args.with_launch) for v in views])
        return 0
    moment = now()
    rows = [
        (v.run_id, "?", "BROKEN", "-", "-", "-", "-", "-", "-")
        if v.state is None
        else (
            v.run_id,
            v.state.project,
            "BROKEN" if v.broken else v.state.status,
            str(v.state.step),
            str(v.state.resume_count),
            str(v.state.failures),
            f"{v.state.cost_hours_at(moment):.2f} {v.state.cost_unit}",
            render.timestamp(v.state.updated_at),
            render.vouched_by(v.vouched),
        )
        for v in views
    ]
    header = ("RUN", "PROJECT", "STATE", "STEP", "RESUMES", "FAILURES", "COST", "UPDATED", "SIGNED BY")
    render.emit(render.table(header, rows))
    return 0


async def run_cost(app: RunService, args: argparse.Namespace, _: None) -> int:
    """The cost of each run and in total, each in its unit as launched (GPU-hours; a CPU job's CPU- or
    node-hours); with --run, that run's goodput and cost. A broken or unvouched run's hours are shown but never
    added to the total: what a forger appended was not spent."""
    if args.run is not None:
        return await _run_goodput(app, args)
    moment = now()
    priced = [(v, _cost_document(v, v.state, moment)) for v in await app.views(args.project) if v.state]
    docs = [doc for _, doc in priced]
    totals, uncounted = (
        _totals(d for d in docs if d["broken"] is None),
        _totals(d for d in docs if d["broken"]),
    )
    if args.json:
        render.emit_json({"project": args.project, "runs": docs,
                          "total_gpu_hours": totals.get("GPU-hours", 0.0),
                          "uncounted_gpu_hours": uncounted.get("GPU-hours", 0.0),
                          "totals": totals, "uncounted": uncounted})  # fmt: skip
        return 0
    rows = [
        (d["run_id"], d["state"].upper() if d["broken"] else d["state"], str(d["gpus"]),
         f"{d['cost_hours']:.2f} {d['cost_unit']}", d["source"], render.vouched_by(v.vouched))
        for v, d in priced
    ]  # fmt: skip
    render.emit(render.table(("RUN", "STATE", "WORLD", "COST", "SOURCE", "SIGNED BY"), rows))
    left_out = sum(1 for d in docs if d["broken"] is not None)
    line = f"total {_sum_line(totals)} over {len(priced) - left_out} run(s)"
    if left_out:
        line += f"; not counted: {_sum_line(uncounted)} of {left_out} broken or unvouched run(s)"
    render.emit(line)
    return 0


def _totals(docs: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Hours per unit, GPU-hours always present (0 when no GPU job)."""
    totals: dict[str, float] = {"GPU-hours": 0.0}
    for d in docs:
        totals[d["cost_unit"]] = round(totals.get(d["cost_unit"], 0.0) + d["cost_hours"], 6)
    return totals


def _sum_line(totals: dict[str, float]) -> str:
    """`12.50 GPU-hours`, then `3.00 node-hours` and so on for any unit a run of these was costed in."""
    shown = [f"{hours:.2f} {unit}" for unit, hours in totals.items() if unit == "GPU-hours" or hours]
    return ", ".join(shown)


def _cost_document(view: RunView, state: RunState, moment: datetime) -> dict[str, Any]:
    """A run in `cost --json`: its hours so far or as completed (`cost_hours` in `cost_unit`; `gpu_hours`: 0
    for a CPU job), its world size (`gpus`: processes), and whether they count (`broken` null)."""
    return {"run_id": state.run_id, "state": "broken" if view.broken else state.status, "gpus": state.gpus,
            **_hours(state, moment), "vouched": view.vouched is not None, "broken": view.broken}  # fmt: skip


async def _run_goodput(app: RunService, args: argparse.Namespace) -> int:
    """One run's goodput breakdown; exit 1 when its chain is broken (shown as far as it holds, as `status`)."""
    view = await app.view(args.run)
    state, goodput = view.state, view.goodput
    if args.json:
        doc: dict[str, Any] = {"run_id": view.run_id}
        if state is not None and goodput is not None:
            doc.update(
                state=state.status,
                gpus=state.gpus,
                **_hours(state, now()),
                goodput=goodput_view.document(goodput),
            )
        if view.broken is not None:
            doc["state"] = "broken"
        render.emit_json({**doc, "broken": view.broken})
        return 0 if view.broken is None else 1
    if view.broken is not None:
        render.emit(render.finding(view.broken))
    if state is not None and goodput is not None:
        hours = _hours(state, now())
        world = (
            f"{state.gpus} GPU(s)" if state.cost_unit == "GPU-hours" else f"{state.gpus} process(es) on CPUs"
        )
        render.emit(goodput_view.breakdown(state.run_id, state.status, goodput))
        render.emit(f"{state.cost_unit} {hours['cost_hours']:.2f} over {world} ({hours['source']})")
    return 0 if view.broken is None else 1


def _hours(state: RunState, moment: datetime) -> dict[str, Any]:
    return {"gpu_hours": round(state.gpu_hours_at(moment), 6), "cost_hours": round(state.cost_hours_at(moment), 6),
            "cost_unit": state.cost_unit, "source": state.cost_source or "so far"}  # fmt: skip


async def run_audit(app: RunService, args: argparse.Namespace, _: None) -> int:
    """Verify chains, signatures and anchors from the stream; exit 1 naming the first bad event of each
    broken or unvouched run and whatever the anchors say was lost."""
    report = await app.verify(args.run_id)
    if args.run_id is not None and report.runs == 0 and not report.findings and not report.stream_findings:
        raise NotFound(f"unknown run {args.run_id!r}")
    if args.json:
        render.emit_json({"ok": report.ok, **msgspec.structs.asdict(report)})
        return 0 if report.ok else 1
    for line in report.accepted:
        render.emit(f"accepted by `ftrain server repair`: {line}")
    for line in report.ignored:
        render.emit(f"ignored: {line}")
    for line in report.stream_findings:
        render.emit(f"STREAM: {line}")
    for item in report.findings:
        render.emit(render.finding(item))
    broken = len(report.findings) + len(report.stream_findings)
    verdict = (
        f"every chain intact and anchored{render.signers(report.signers)}"
        if report.ok
        else f"{broken} finding(s)"
    )
    render.emit(f"Verified {report.events} event(s) in {report.runs} run(s): {verdict}")
    return 0 if report.ok else 1


async def run_replay(app: RunService, args: argparse.Namespace, _: None) -> int:
    """The timeline, oldest first, or a rebuild of the read model."""
    if args.rebuild:
        applied = await app.rebuild()
        render.emit(f"Rebuilt the read model from stream seq 1: {applied} event(s) applied")
        return 0
    if args.run_id is not None:
        await app.state_of(args.run_id)
    entries = await app.timeline(args.run_id)
    if args.json:
        render.emit_json(entries)
        return 0
    for e in entries:
        if e.event is not None:
            render.emit(
                f"#{e.stream_seq:<6} {render.timestamp(e.event.time)}  {e.run_id}  seq {e.event.seq:<4} "
                f"{e.event_type:<16} {render.summary(e.event)}"
            )
        elif e.finding is not None:
            render.emit(
                f"#{e.stream_seq:<6} {'?':20}  {e.run_id}  {e.event_type:<16} REJECTED: {e.finding.reason}"
            )
    return 0
