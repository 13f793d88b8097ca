"""Charts as inline SVG, drawn by the server: no script, no library, nothing fetched. Colours come from the
stylesheet through class names (the page's policy allows no inline style); every label goes through `markup`.

A chart of many marks draws them as one path, at most one mark a pixel (a 10,000-event run's checkpoints are
one element of at most 1,000 ticks, not 10,000 elements), and only the rarer marks (failures, resumes, skips, rejected records) are links to their events.
"""

from collections.abc import Sequence
from datetime import datetime

from msgspec import UNSET

from ftrain.cli.goodput_view import LABELS, duration, share
from ftrain.cli.render import timestamp
from ftrain.events.schema import Checkpointed, Failed
from ftrain.projections.event_verdict import Judged
from ftrain.projections.goodput import TERMS, AttemptSpan, Goodput
from ftrain.web.markup import event_href, text

WIDTH = 1000
LINKED_CHECKPOINTS = 200
"""Up to this many checkpoints each get a mark of their own, a link to their event; more are one path."""
TAKEOVER, HANG = "lost", "hang"
_TROUBLE = frozenset({"failed", "takeover", "hang", "rejected", "corrupt_skipped"})
"""The marks drawn on the upper row, apart from the resumes and completions that follow them closely."""


def _svg(height: int, body: str, label: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {WIDTH} {height}" '
        f'width="{WIDTH}" height="{height}" role="img" aria-label="{text(label)}">{body}</svg>'
    )


def goodput_bar(g: Goodput) -> str:
    """The wall time as one bar, a segment per term (an unknown term has none: its time is in `other`)."""
    parts = [(t, getattr(g, t) or 0.0) for t in TERMS] + [("other", max(g.other, 0.0))]
    total = sum(s for _, s in parts)
    x, body = 0.0, []
    for term, seconds in parts:
        if total <= 0 or seconds <= 0:
            continue
        w = seconds / total * WIDTH
        label = f"{LABELS.get(term, term)}: {duration(seconds)} ({share(seconds, g.wall)})"
        body.append(
            f'<rect class="g-{term}" x="{x:.2f}" y="0" width="{w:.2f}" height="28"><title>{text(label)}</title></rect>'
        )
        x += w
    return _svg(28, "".join(body), "goodput breakdown")


def stall_chart(saves: Sequence[Checkpointed]) -> str:
    """The stall each save held the training loop for, one bar per save in order (a save that did not
    report it: no bar)."""
    stalls = [(n, s.stall_seconds) for n, s in enumerate(saves) if s.stall_seconds is not UNSET]
    if not stalls:
        return '<p class="muted">no save reported its stall</p>'
    top = max(s for _, s in stalls) or 1.0
    height = 80
    if len(saves) > WIDTH:  # more saves than pixels: each pixel's column shows its longest stall
        columns: dict[int, float] = {}
        for n, s in stalls:
            column = n * WIDTH // len(saves)
            columns[column] = max(columns.get(column, 0.0), s)
        stalls, w = sorted(columns.items()), 1.0
    else:
        w = WIDTH / len(saves)
    path = "".join(
        f"M{n * w:.1f} {height}V{height - s / top * (height - 4):.1f}h{max(w * 0.8, 0.5):.1f}V{height}"
        for n, s in stalls
    )
    axis = f'<text class="axis" x="2" y="10">max {text(duration(top))}</text>'
    return _svg(height, f'<path class="stall" d="{path}"/>{axis}', f"stall of {len(stalls)} save(s)")


def _kind(v: Judged) -> str:
    """The mark an event gets on the timeline."""
    if not v.ok:
        return "rejected"
    if isinstance(v.event, Failed):
        return {TAKEOVER: "takeover", HANG: "hang"}.get(v.event.reason, "failed")
    return v.event_type


def timeline(records: Sequence[Judged], spans: Sequence[AttemptSpan], run_id: str, end: datetime) -> str:
    """The run from launch to `end`: its attempts as alternating bands, checkpoints as ticks, and a mark per
    failure (by reason; a lease takeover and a hang marked as such), corrupt-skip and rejected record on one
    row, resume, launch and completion on the next, each a link to its event."""
    timed = [v for v in records if v.event is not None]
    if not timed or not spans:
        return '<p class="muted">no event to draw</p>'
    start = spans[0].opened
    span_s = max((end - start).total_seconds(), 1e-3)

    def x(moment: datetime) -> float:
        return min(max((moment - start).total_seconds() / span_s, 0.0), 1.0) * (WIDTH - 10) + 5

    body = []
    for n, a in enumerate(spans):
        closes = a.failed_at or (spans[n + 1].opened if n + 1 < len(spans) else end)
        title = f"attempt {n + 1}: from step {a.from_step}, {len(a.saves)} checkpoint(s)"
        body.append(
            f'<rect class="attempt a{n % 2}" x="{x(a.opened):.2f}" y="18" '
            f'width="{max(x(closes) - x(a.opened), 1):.2f}" height="34"><title>{text(title)}</title></rect>'
        )
    checkpoints = [v.event.time for v in timed if isinstance(v.event, Checkpointed) and v.ok]
    pathed = len(checkpoints) > LINKED_CHECKPOINTS
    if pathed:
        pixels = sorted({round(x(moment)) for moment in checkpoints})  # a tick a pixel
        d = "".join(f"M{at} 22v26" for at in pixels)
        body.append(f'<path class="tick" d="{d}"><title>{len(checkpoints)} checkpoints</title></path>')
    marks = [v for v in timed if not (pathed and v.ok and isinstance(v.event, Checkpointed))]
    for v in marks:
        assert v.event is not None
        kind = _kind(v)
        cx = x(v.event.time)
        shape = (
            f'<rect class="m-{kind}" x="{cx - 1:.2f}" y="22" width="2" height="26"/>'
            if kind == "checkpointed"
            else f'<circle class="m-{kind}" cx="{cx:.2f}" cy="{64 if kind in _TROUBLE else 78}" r="5"/>'
        )
        title = f"{v.event_type} seq {v.event.seq} at {timestamp(v.event.time)}" + (
            f": {v.event.reason}" if isinstance(v.event, Failed) else ""
        )
        body.append(f'<a href="{event_href(run_id, v.stream_seq)}">{shape}<title>{text(title)}</title></a>')
    axis = (
        f'<text class="axis" x="5" y="12">{text(timestamp(start))}</text>'
        f'<text class="axis" x="{WIDTH - 5}" y="12" text-anchor="end">{text(timestamp(end))}</text>'
    )
    return _svg(88, axis + "".join(body), f"timeline of {len(spans)} attempt(s)")
