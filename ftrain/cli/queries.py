"""The read-only commands: status, list, cost (per project, or one run's goodput), audit verify, replay."""

import argparse
from typing import Any

import msgspec

from events.schema import now
from ftrain.cli import goodput_view, render
from ftrain.errors import UsageError
from ftrain.service import RunService, RunView
from projections.lifecycle import CheckpointRef, RunState

# -- queries ---------------------------------------------------------------------------------------------------


def checkpoint_document(ref: CheckpointRef) -> dict[str, Any]:
    """A checkpoint in `status --json`: the fields of the event that recorded it, its status and reason."""
    r = ref.recorded
    return {"seq": r.seq, "step": r.step, "epoch": r.epoch, "shards": r.shards, "uri": r.uri,
            "checkpoint_hash": r.checkpoint_hash, "size_bytes": r.size_bytes, "time": r.time,
            "status": ref.status, "reason": ref.reason}  # fmt: skip


def view_document(view: RunView) -> dict[str, Any]:
    """A run in `status --json` and `list --json`: its status document, or only its name when none of its
    events was accepted; a broken run's `state` is "broken" and `broken` carries the finding."""
    doc: dict[str, Any] = status_document(view.state) if view.state else {"run_id": view.run_id}
    if view.broken is not None:
        doc["state"] = "broken"
    doc["broken"] = view.broken
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
    """Runs, optionally of one project; a broken run shows as BROKEN."""
    views = await app.views(args.project)
    if args.json:
        render.emit_json([view_document(v) for v in views])
        return 0
    moment = now()
    rows = [
        (v.run_id, "?", "BROKEN", "-", "-", "-", "-")
        if v.state is None
        else (
            v.run_id,
            v.state.project,
            "BROKEN" if v.broken else v.state.status,
            str(v.state.step),
            str(v.state.resume_count),
            str(v.state.failures),
            f"{v.state.gpu_hours_at(moment):.2f}",
        )
        for v in views
    ]
    render.emit(render.table(("RUN", "PROJECT", "STATE", "STEP", "RESUMES", "FAILURES", "GPU-HOURS"), rows))
    return 0


async def run_cost(app: RunService, args: argparse.Namespace, _: None) -> int:
    """GPU-hours per run and in total; with --run, that run's goodput and GPU-hours."""
    if args.run is not None:
        return await _run_goodput(app, args)
    states = await app.states(args.project)
    moment = now()
    per_run = [
        (s.run_id, s.status, s.gpus, round(s.gpu_hours_at(moment), 6), s.cost_source or "so far")
        for s in states
    ]
    total = round(sum(r[3] for r in per_run), 6)
    if args.json:
        runs = [
            {"run_id": r, "state": st, "gpus": g, "gpu_hours": h, "source": src}
            for r, st, g, h, src in per_run
        ]
        render.emit_json({"project": args.project, "runs": runs, "total_gpu_hours": total})
        return 0
    rows = [(r, st, str(g), f"{h:.2f}", src) for r, st, g, h, src in per_run]
    render.emit(render.table(("RUN", "STATE", "GPUS", "GPU-HOURS", "SOURCE"), rows))
    render.emit(f"total {total:.2f} GPU-hours over {len(per_run)} run(s)")
    return 0


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
