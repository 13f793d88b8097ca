"""The pages, as HTML strings, from what the service reads (pure: no I/O, the moment passed in).

The figures are the CLI's own: a run's row is `list --json`'s document (`queries.view_document`), its goodput
`cost --run`'s terms and notes (`goodput_view`), its verdicts `audit verify`'s and `events tail`'s. Every
field goes through `markup.text`; the pages load one stylesheet and one script, both from the package.
"""

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import msgspec

from ftrain.auditor import AuditReport
from ftrain.cli import goodput_view, render
from ftrain.cli.queries import view_document
from ftrain.events.schema import Failed
from ftrain.projections.event_verdict import EventVerdict, Judged
from ftrain.projections.goodput import TERMS, AttemptSpan, Goodput
from ftrain.service.run_queries import RunView
from ftrain.web import charts
from ftrain.web.markup import event_href, lines, run_href, text

EVENTS_SHOWN = 200
"""A run's page lists its newest events up to this many (`?all=1`: every one); the reader picks them."""


class RunDetail(msgspec.Struct, frozen=True):
    """What one run's page shows: its view (as `status`), every record of its subject as the chain walk
    judged it, the records listed (newest first) with their signatures checked too, its attempts (as goodput
    folds them) and the audit of its chain."""

    view: RunView
    records: list[Judged]
    shown: list[EventVerdict]
    spans: list[AttemptSpan]
    report: AuditReport


def page(title: str, body: str, seq: int) -> str:
    """The frame of every page: `seq` is the stream sequence it shows, which the live script compares."""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>{text(title)} · ftrain</title><link rel="stylesheet" href="/static/ui.css">'
        '<script src="/static/ui.js" defer></script></head>'
        f'<body data-seq="{seq}"><header><a class="home" href="/">ftrain</a> <span class="muted">read-only view '
        f'of the log</span> <span id="live" class="muted">stream seq {seq}</span></header>'
        f"<main>{body}</main></body></html>"
    )


def not_found(what: str, seq: int) -> str:
    """The 404 page."""
    return page(
        "not found", f'<h1>Not found</h1><p class="bad">{text(what)}</p><p><a href="/">all runs</a></p>', seq
    )


def _age(then: datetime, moment: datetime) -> str:
    """`12.5 min ago`; past two days in days (`3.2 d ago`)."""
    seconds = max((moment - then).total_seconds(), 0.0)
    return (f"{seconds / 86400:.1f} d" if seconds >= 2 * 86400 else goodput_view.duration(seconds)) + " ago"


def _state_badge(state: str, finding: Any) -> str:
    title = f' title="{text(finding.describe())}"' if finding is not None else ""
    return f'<span class="state s-{text(state)}"{title}>{text(state)}</span>'


def _ratio(g: Goodput | None) -> str:
    """The goodput as a share; `unknown` where its events do not say how long training took (as `status`)."""
    if g is None:
        return "—"
    return goodput_view.UNKNOWN if g.ratio is None else f"{g.ratio * 100:.1f} %"


def _checkpoint_cell(doc: dict[str, Any] | None, moment: datetime) -> str:
    if not doc:
        return '<span class="muted">none</span>'
    return f'step {doc["step"]} <span class="muted">({text(_age(doc["time"], moment))})</span>'


def runs_page(views: Sequence[RunView], seq: int, moment: datetime) -> str:
    """Every run: state, step, attempt, goodput, failures, last valid checkpoint and its age, and who
    vouches for it; a broken or unvouched run reads so in its state and its signer columns."""
    rows = []
    for v in views:
        doc = view_document(v, whole=False)
        signer = render.vouched_by(v.vouched) if v.state is not None else "—"
        signer_class = "bad" if v.vouched is None else ""
        if v.state is None:
            cells = ["?", _state_badge("broken", v.broken), "—", "—", "—", "—", "—"]
        else:
            cells = [text(v.state.project), _state_badge(doc["state"], v.broken), str(v.state.step),
                     str(v.state.attempt), _ratio(v.goodput), str(v.state.failures),
                     _checkpoint_cell(doc["last_valid_checkpoint"], moment)]  # fmt: skip
        rows.append(
            f'<tr><td><a href="{run_href(v.run_id)}">{text(v.run_id)}</a></td>'
            + "".join(f"<td>{c}</td>" for c in cells)
            + f'<td class="{signer_class}">{text(signer)}</td></tr>'
        )
    head = "".join(f"<th>{h}</th>" for h in ("run", "project", "state", "step", "attempt", "goodput",
                                               "failures", "last valid checkpoint", "signed by"))  # fmt: skip
    table = f'<table class="runs"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
    body = f"<h1>Runs</h1>{table}" if rows else '<h1>Runs</h1><p class="muted">the log holds no run yet</p>'
    return page("runs", body, seq)


def _summary(view: RunView, moment: datetime) -> str:
    state = view.state
    assert state is not None
    valid = next(iter(state.valid_checkpoints()), None)
    last = (
        f"step {valid.step} epoch {valid.epoch} · {text(valid.uri)} · hash {text(render.short_hash(valid.checkpoint_hash))} "
        f'<span class="muted">({text(_age(valid.time, moment))})</span>'
        if valid
        else '<span class="muted">none</span>'
    )
    items = [
        ("project", text(state.project)),
        ("step", f"{state.step} (epoch {state.epoch})"),
        ("attempt", str(state.attempt)),
        ("resumes", str(state.resume_count)),
        ("failures", f"{state.failures}" + (f" (last: {text(state.last_failure)})" if state.last_failure else "")),
        ("last valid checkpoint", last),
        ("signed by", f'<span class="{"bad" if view.vouched is None else ""}">{text(render.vouched_by(view.vouched))}</span>'),
        ("chain head", f"seq {state.head.seq} {text(render.short_hash(state.head.hash))} (stream seq {state.head.stream_seq})"),
    ]  # fmt: skip
    return "<dl>" + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


def _memory(view: RunView) -> str:
    """The newest memory snapshot (as `status`'s `memory` line) and each node's part with its replica."""
    snapshot = view.state.snapshot if view.state is not None else None
    if snapshot is None:
        return ""
    rows = "".join(
        f'<tr class="replica-{c.replica}"><td>{c.part.node}</td><td>{text(c.part.host)}</td>'
        f"<td>{text(render.ranks(c.part.first_rank, c.part.ranks))}</td><td>{c.part.size_bytes}</td>"
        f"<td>{text(render.replica(c))}</td></tr>"
        for c in snapshot.nodes()
    )
    head = "".join(f"<th>{h}</th>" for h in ("node", "host", "ranks", "bytes", "replica"))
    table = (
        f'<table class="memory"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>' if rows else ""
    )
    return (
        f"<section><h2>Memory snapshot</h2><p>{text(render.memory_snapshot(snapshot))}</p>{table}</section>"
    )


def _audit(report: AuditReport, view: RunView) -> str:
    """`audit verify RUN`'s verdict, and the view's (an unvouched run is broken to every view)."""
    if report.ok and view.broken is None:
        said = f"every chain intact and anchored{render.signers(report.signers)}"
        return f'<section class="verdict ok"><h2>Audit</h2><p>{text(said)}</p></section>'
    found = [render.finding(f) for f in report.findings] + [f"STREAM: {s}" for s in report.stream_findings]
    if view.broken is not None and not report.findings:
        found.append(render.finding(view.broken))
    items = "".join(f"<li>{text(line)}</li>" for line in found)
    return f'<section class="verdict bad"><h2>Audit</h2><ul>{items}</ul></section>'


def _goodput(view: RunView) -> str:
    g, state = view.goodput, view.state
    if g is None or state is None:
        return ""
    notes = goodput_view.notes(g, state.status)
    rows = [("wall time", g.wall, notes["wall"], "")]
    rows += [(goodput_view.LABELS[t], getattr(g, t), notes[t], f"g-{t}") for t in TERMS]
    rows.append(("other", g.other, notes["other"], "g-other"))
    cells = "".join(
        f'<tr><td><span class="key {cls}"></span>{text(label)}</td>'
        f"<td>{'unknown' if s is None else text(goodput_view.duration(s))}</td>"
        f"<td>{text(goodput_view.share(s, g.wall))}</td><td>{text(what)}</td></tr>"
        for label, s, what, cls in rows
    )
    return (
        f"<section><h2>Goodput {_ratio(g)}</h2>{charts.goodput_bar(g)}"
        f'<table class="terms"><thead><tr><th>term</th><th>time</th><th>share</th><th>what</th></tr></thead>'
        f"<tbody>{cells}</tbody></table></section>"
    )


def _stalls(spans: Sequence[AttemptSpan]) -> str:
    saves = [s for a in spans for s in a.saves]
    told = [s.stall_seconds for s in saves if isinstance(s.stall_seconds, float)]
    said = (
        f"{len(saves)} save(s); stall mean {goodput_view.duration(sum(told) / len(told))}, "
        f"max {goodput_view.duration(max(told))}"
        if told
        else f"{len(saves)} save(s)"
    )
    return f"<section><h2>Stall per save</h2><p>{text(said)}</p>{charts.stall_chart(saves)}</section>"


def _failures(detail: RunDetail, run_id: str) -> str:
    """Each accepted failure with its reason, the step its attempt had saved, and the steps the next
    attempt re-did (lost)."""
    failed = [v for v in detail.records if v.ok and isinstance(v.event, Failed)]
    ended = [n for n, a in enumerate(detail.spans) if a.failed_at is not None]
    rows = []
    for v, n in zip(failed, ended, strict=False):
        assert isinstance(v.event, Failed)
        span = detail.spans[n]
        saved = span.saves[-1].step if span.saves else span.from_step
        after = detail.spans[n + 1].lost_steps if n + 1 < len(detail.spans) else None
        lost = ("not resumed" if n + 1 >= len(detail.spans) else "unknown") if after is None else str(after)
        code = "" if v.event.exit_code is None else str(v.event.exit_code)
        rows.append(
            f'<tr><td><a href="{event_href(run_id, v.stream_seq)}">#{v.stream_seq}</a></td>'
            f"<td>{text(render.timestamp(v.event.time))}</td><td>{n + 1}</td>"
            f'<td><span class="reason r-{text(v.event.reason)}">{text(v.event.reason)}</span></td><td>{text(code)}</td>'
            f'<td class="message">{text(v.event.message)}</td><td>{saved}</td><td>{text(lost)}</td></tr>'
        )  # fmt: skip
    if not rows:
        return '<section><h2>Failures</h2><p class="muted">none</p></section>'
    head = "".join(f"<th>{h}</th>" for h in ("event", "time", "attempt", "reason", "exit", "message",
                                               "saved step", "lost steps"))  # fmt: skip
    return f"<section><h2>Failures</h2><table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></section>"


def _attempts(spans: Sequence[AttemptSpan]) -> str:
    rows = "".join(
        f"<tr><td>{n}</td><td>{text(render.timestamp(a.opened))}</td><td>{a.from_step}</td><td>{len(a.saves)}</td>"
        f"<td>{a.saves[-1].step if a.saves else '—'}</td>"
        f"<td>{'failed ' + text(render.timestamp(a.failed_at)) if a.failed_at else ''}</td></tr>"
        for n, a in enumerate(spans, start=1)
    )  # fmt: skip
    head = "".join(
        f"<th>{h}</th>" for h in ("attempt", "opened", "from step", "checkpoints", "last step", "ended")
    )
    return f"<section><h2>Attempts</h2><table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></section>"


def _event_row(v: EventVerdict, run_id: str) -> str:
    e = v.event
    when = render.timestamp(e.time) if e is not None else "?"
    seq = str(e.seq) if e is not None else "?"
    said = render.summary(e) if e is not None else ""
    chain = "ok" if v.ok else f"REJECTED: {v.chain}"
    return (
        f'<tr class="{"" if v.ok else "rejected"}"><td><a href="{event_href(run_id, v.stream_seq)}">#{v.stream_seq}</a></td>'
        f"<td>{seq}</td><td>{text(when)}</td><td>{text(v.event_type)}</td><td>{text(said)}</td>"
        f'<td class="{"" if v.ok else "bad"}">{text(chain)}</td><td>{text(v.signature.verdict)}</td></tr>'
    )  # fmt: skip


def _events(detail: RunDetail, run_id: str) -> str:
    more = ""
    if len(detail.shown) < len(detail.records):
        more = (f'<p>the newest {len(detail.shown)} of {len(detail.records)}: '
                f'<a href="{run_href(run_id)}?all=1">every event</a></p>')  # fmt: skip
    head = "".join(f"<th>{h}</th>" for h in ("event", "seq", "time", "type", "what", "chain", "signature"))
    rows = "".join(_event_row(v, run_id) for v in detail.shown)
    return f'<section><h2>Events</h2>{more}<table class="events"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></section>'


def run_page(detail: RunDetail, seq: int, moment: datetime) -> str:
    """One run: its summary, its newest memory snapshot per node, the audit's verdict, the timeline of its attempts, its goodput, the stall per
    save, its failures with the steps each lost, its attempts and its events (newest first)."""
    view, run_id = detail.view, detail.view.run_id
    state = view.state
    if state is None:
        status, summary = "broken", ""
    else:
        status, summary = ("broken" if view.broken else state.status), _summary(view, moment)
    end = moment if state is None or state.status != "completed" else state.updated_at
    legend = "".join(
        f'<span class="legend"><svg width="12" height="12" class="chart"><circle class="m-{k}" cx="6" cy="6" r="5"/></svg>{w}</span>'
        for k, w in (("failed", "failure"), ("takeover", "lease takeover"), ("hang", "hang"), ("resumed", "resume"),
                     ("corrupt_skipped", "corrupt-skip"), ("completed", "completed"), ("rejected", "rejected record"))
    )  # fmt: skip
    body = (
        f"<h1>{text(run_id)} {_state_badge(status, view.broken)}</h1>{summary}{_memory(view)}"
        f"{_audit(detail.report, view)}"
        f"<section><h2>Timeline</h2>{charts.timeline(detail.records, detail.spans, run_id, end)}"
        f'<p class="muted">{legend}</p></section>'
        f"{_goodput(view)}{_stalls(detail.spans)}{_failures(detail, run_id)}{_attempts(detail.spans)}"
        f"{_events(detail, run_id)}"
    )
    return page(run_id, body, seq)


def event_page(v: EventVerdict, seq: int) -> str:
    """One record: where it sits, its hashes, who signed it, both verdicts, and the event as stored."""
    e = v.event
    items = [
        ("run", f'<a href="{run_href(v.run_id)}">{text(v.run_id)}</a>'),
        ("stream seq", str(v.stream_seq)),
        ("seq", "?" if e is None else str(e.seq)),
        ("type", text(v.event_type)),
        ("time", "?" if e is None else text(render.timestamp(e.time))),
        ("hash", text(v.hash or "?")),
        ("prev hash", "?" if e is None else text(e.prev_hash)),
        ("chain", text("ok" if v.ok else f"REJECTED: {v.chain}")),
        ("signature", text(v.signature.verdict)),
        ("signer key", text(v.signature.signer or "none")),
    ]
    detail = "<dl>" + "".join(f"<dt>{k}</dt><dd>{val}</dd>" for k, val in items) + "</dl>"
    stored = "" if e is None else msgspec.json.format(msgspec.json.encode(e), indent=2).decode()
    body = (
        f'<h1>{text(v.event_type)} <span class="muted">stream seq {v.stream_seq}</span></h1>'
        f'<section class="verdict {"ok" if v.ok else "bad"}">{detail}</section>'
        f"<section><h2>The event</h2><pre>{lines(stored) or 'undecodable'}</pre></section>"
    )
    return page(f"{v.run_id} #{v.stream_seq}", body, seq)
