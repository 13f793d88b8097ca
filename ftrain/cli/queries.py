"""The read-only commands: status, list, cost (per project, or one run's goodput), audit verify, replay."""

import argparse
from datetime import datetime
from typing import Any

import msgspec

from ftrain.cli import goodput_view, render
from ftrain.errors import UsageError
from ftrain.events.schema import now
from ftrain.projections.lifecycle import CheckpointRef, RunState
from ftrain.service import RunService, RunView

# -- queries ---------------------------------------------------------------------------------------------------


def checkpoint_document(ref: CheckpointRef) -> dict[str, Any]:
    """A checkpoint in `status --json`: the fields of the event that recorded it, its status and reason."""
    r = ref.recorded
    return {"seq": r.seq, "step": r.step, "epoch": r.epoch, "shards": r.shards, "uri": r.uri,
            "checkpoint_hash": r.checkpoint_hash, "size_bytes": r.size_bytes, "time": r.time,
            "status": ref.status, "reason": ref.reason}  # fmt: skip


def view_document(view: RunView) -> dict[str, Any]:
    """A run in `status --json` and `list --json`: its status document, or only its name when none of its
    events was accepted; a broken or unvouched run's `state` is "broken" and `broken` carries the finding
    (for an unvouched one: its first event no trusted writer vouches for, and why). `vouched`: whether a
    trusted writer vouches for the run (or it is an unsigned log accepted); `signed_by`: that writer."""
    doc: dict[str, Any] = status_document(view.state) if view.state else {"run_id": view.run_id}
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
        "resume_count": state.resume_count,
        "failures": state.failures,
        "last_failure": state.last_failure,
        "gpu_hours": round(state.gpu_hours_at(moment), 6),
        "running_seconds": round(state.running_seconds_at(moment), 3),
        "chain_head": state.head,
        "checkpoints": [checkpoint_document(c) for c in state.checkpoints],
        "launch": state.launch,
        "nodes": state.nodes,
        "gpus": state.gpus,
    }


async def run_status(app: RunService, args: argparse.Namespace, _: None) -> int:
    """One run; exit 1 when its chain is broken."""
    view = await app.view(args.run_id)
    if args.json:
        render.emit_json(view_document(view))
    else:
        if view.broken is not None:  # first: what the rest shows is only the state before the break
            render.emit(render.finding(view.broken))
        if view.state is not None:
            *lines, head = render.status(view.state, now())
            if view.goodput is not None:
                lines.append(goodput_view.status_line(view.goodput))
            render.emit([*lines, head])
    return 0 if view.broken is None else 1


async def run_list(app: RunService, args: argparse.Namespace, _: None) -> int:
    """Runs, optionally of one project; a broken or unvouched run shows as BROKEN, and SIGNED BY says who
    vouches for each (UNVOUCHED: no trusted writer)."""
    views = await app.views(args.project)
    if args.json:
        render.emit_json([view_document(v) for v in views])
        return 0
    moment = now()
    rows = [
        (v.run_id, "?", "BROKEN", "-", "-", "-", "-", "-")
        if v.state is None
        else (
            v.run_id,
            v.state.project,
            "BROKEN" if v.broken else v.state.status,
            str(v.state.step),
            str(v.state.resume_count),
            str(v.state.failures),
            f"{v.state.gpu_hours_at(moment):.2f}",
            render.vouched_by(v.vouched),
        )
        for v in views
    ]
    header = ("RUN", "PROJECT", "STATE", "STEP", "RESUMES", "FAILURES", "GPU-HOURS", "SIGNED BY")
    render.emit(render.table(header, rows))
    return 0


async def run_cost(app: RunService, args: argparse.Namespace, _: None) -> int:
    """GPU-hours per run and in total; with --run, that run's goodput and GPU-hours. A broken or unvouched
    run's hours are shown but never added to the total: what a forger appended was not spent."""
    if args.run is not None:
        return await _run_goodput(app, args)
    moment = now()
    priced = [(v, _cost_document(v, v.state, moment)) for v in await app.views(args.project) if v.state]
    docs = [doc for _, doc in priced]
    total = sum(d["gpu_hours"] for d in docs if d["broken"] is None)
    uncounted = sum(d["gpu_hours"] for d in docs if d["broken"] is not None)
    if args.json:
        render.emit_json({"project": args.project, "runs": docs,
                          "total_gpu_hours": round(total, 6), "uncounted_gpu_hours": round(uncounted, 6)})  # fmt: skip
        return 0
    rows = [
        (d["run_id"], d["state"].upper() if d["broken"] else d["state"], str(d["gpus"]), f"{d['gpu_hours']:.2f}",
         d["source"], render.vouched_by(v.vouched))
        for v, d in priced
    ]  # fmt: skip
    render.emit(render.table(("RUN", "STATE", "GPUS", "GPU-HOURS", "SOURCE", "SIGNED BY"), rows))
    left_out = sum(1 for d in docs if d["broken"] is not None)
    line = f"total {total:.2f} GPU-hours over {len(priced) - left_out} run(s)"
    if left_out:
        line += f"; not counted: {uncounted:.2f} GPU-hours of {left_out} broken or unvouched run(s)"
    render.emit(line)
    return 0


def _cost_document(view: RunView, state: RunState, moment: datetime) -> dict[str, Any]:
    """A run in `cost --json`: its hours so far or as completed, and whether they count (`broken` null)."""
    return {"run_id": state.run_id, "state": "broken" if view.broken else state.status, "gpus": state.gpus,
            "gpu_hours": round(state.gpu_hours_at(moment), 6), "source": state.cost_source or "so far",
            "vouched": view.vouched is not None, "broken": view.broken}  # fmt: skip


async def _run_goodput(app: RunService, args: argparse.Namespace) -> int:
    """One run's goodput breakdown; exit 1 when its chain is broken (shown as far as it holds, as `status`)."""
    view = await app.view(args.run)
    state, goodput = view.state, view.goodput
    if args.json:
        doc: dict[str, Any] = {"run_id": view.run_id}
        if state is not None and goodput is not None:
            doc.update(
                state=state.status, gpus=state.gpus, **_hours(state), goodput=goodput_view.document(goodput)
            )
        if view.broken is not None:
            doc["state"] = "broken"
        render.emit_json({**doc, "broken": view.broken})
        return 0 if view.broken is None else 1
    if view.broken is not None:
        render.emit(render.finding(view.broken))
    if state is not None and goodput is not None:
        hours = _hours(state)
        render.emit(goodput_view.breakdown(state.run_id, state.status, goodput))
        render.emit(f"GPU-hours {hours['gpu_hours']:.2f} over {state.gpus} GPU(s) ({hours['source']})")
    return 0 if view.broken is None else 1


def _hours(state: RunState) -> dict[str, Any]:
    return {"gpu_hours": round(state.gpu_hours_at(now()), 6), "source": state.cost_source or "so far"}


async def run_audit(app: RunService, args: argparse.Namespace, _: None) -> int:
    """Verify chains, signatures and anchors from the stream; exit 1 naming the first bad event of each
    broken or unvouched run and whatever the anchors say was lost."""
    report = await app.verify(args.run_id)
    if args.run_id is not None and report.runs == 0 and not report.findings and not report.stream_findings:
        raise UsageError(f"unknown run {args.run_id!r}")
    if args.json:
        render.emit_json({"ok": report.ok, **msgspec.structs.asdict(report)})
        return 0 if report.ok else 1
    for line in report.accepted:
        render.emit(f"accepted by `ftrain server repair`: {line}")
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
                f"#{e.stream_seq:<6} {e.event.time:%Y-%m-%d %H:%M:%S}  {e.run_id}  seq {e.event.seq:<4} "
                f"{e.event_type:<16} {render.summary(e.event)}"
            )
        elif e.finding is not None:
            render.emit(
                f"#{e.stream_seq:<6} {'?':19}  {e.run_id}  {e.event_type:<16} REJECTED: {e.finding.reason}"
            )
    return 0
