"""The web view's pages and charts, pure: every piece of event text escaped (HTML, quotes, control and
bidirectional characters shown as escapes), broken and unvouched runs shown so, the failures with the steps
each lost, each node's memory snapshot part and its replica, and a 10,000-checkpoint timeline drawn as one
path."""

import re
from datetime import timedelta

import msgspec

from ftrain.auditor import AuditReport
from ftrain.domain.chain_walk import Finding
from ftrain.domain.lifecycle import RunState
from ftrain.domain.vouching import Vouched
from ftrain.events.record import StoredRecord
from ftrain.events.schema import (
    HOST_MAX,
    AnyEvent,
    Checkpointed,
    Failed,
    PartReplicas,
    Resumed,
    SnapshotPart,
    SnapshotReplicated,
    Snapshotted,
    event_type,
)
from ftrain.projections.event_verdict import EventVerdict, Judged, SignatureVerdict
from ftrain.projections.goodput import attempt_spans, measure
from ftrain.service.run_queries import RunView
from ftrain.web import charts, pages
from ftrain.web.markup import run_href, text
from tests.support.builders import T0, checkpointed, fold, launched

HOSTILE = "<script>alert(1)</script>\"'&\u202e\x1b[2J\n#9 forged"


def stamped(*events: AnyEvent) -> list[AnyEvent]:
    """The events as `fold` stamps them: the n-th seq n at T0 + n minutes."""
    return [
        msgspec.structs.replace(e, seq=n, time=T0 + timedelta(minutes=n)) for n, e in enumerate(events, 1)
    ]


def judged(events: list[AnyEvent], rejected: int | None = None) -> list[Judged]:
    """The events as the chain walk judges them: the `rejected`-th refused."""
    return [
        Judged(StoredRecord(n, e.run_id, event_type(e), b""), e, f"{n:064x}",
               "ok" if n != rejected else "prev_hash does not match")
        for n, e in enumerate(events, 1)
    ]  # fmt: skip


def verdicts(records: list[Judged]) -> list[EventVerdict]:
    """Each with its signature checked: alice@lab's."""
    signed = SignatureVerdict("ab" * 32, "alice@lab", "signed by alice@lab")
    return [
        EventVerdict(j.stream_seq, j.record.run_id, j.event_type, j.event, j.hash, j.chain, signed)
        for j in records
    ]


def detail(view: RunView, records: list[Judged], report: AuditReport) -> pages.RunDetail:
    events = [j.event for j in records if j.ok and j.event is not None]
    return pages.RunDetail(view, records, verdicts(records[::-1]), attempt_spans(events), report)


def a_run(message: str = HOSTILE) -> tuple[RunState, list[AnyEvent]]:
    """Launched, two checkpoints, a hang (message `message`), a resume from step 20 that lost 3 steps."""
    last = checkpointed("r", 20)
    events = stamped(
        launched("r"), checkpointed("r", 10), last,
        Failed(run_id="r", reason="hang", exit_code=1, message=message, attempt=1),
        Resumed(run_id="r", checkpoint_seq=3, step=20, epoch=2, uri=last.uri, checkpoint_hash=last.checkpoint_hash,
                resume_count=1, attempt=2),
        msgspec.structs.replace(checkpointed("r", 30), attempt=2, lost_steps=3, stall_seconds=0.5),
    )  # fmt: skip
    return fold(*events), events


def test_text_escapes_markup_quotes_and_shows_control_and_bidi_characters() -> None:
    shown = text(HOSTILE)
    assert "<" not in shown and ">" not in shown and '"' not in shown and "'" not in shown
    assert shown.startswith("&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#x27;&amp;")
    assert r"\u202e\x1b[2J\n#9 forged" in shown
    assert run_href('x"><script>') == "/runs/x%22%3E%3Cscript%3E"


def test_a_runs_row_shows_its_figures_and_a_broken_unvouched_run_as_such() -> None:
    state, events = a_run()
    healthy = RunView(
        "r", state, goodput=measure(events, T0 + timedelta(hours=1)), vouched=Vouched("alice@lab")
    )
    finding = Finding("x", 3, 2, "failed", "unsigned")
    odd = msgspec.structs.replace(fold(launched("x", project=HOSTILE)), run_id="x")
    broken = RunView("x", odd, broken=finding)
    html = pages.runs_page([healthy, broken], 7, T0 + timedelta(hours=1))
    rows = re.findall(r"<tr><td>.*?</tr>", html)
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in rows]
    assert [re.sub("<[^>]+>", "", c) for c in cells[0]][1:] == [
        "p", "running", "30", "2", "unknown", "1", "step 30 (54.0 min ago)", "alice@lab",
    ]  # fmt: skip
    assert "broken" in cells[1][2] and "UNVOUCHED" in cells[1][8] and 'class="bad"' in rows[1]
    assert "<script>" not in html.replace('<script src="/static/ui.js" defer>', "")
    assert 'data-seq="7"' in html


def test_a_run_page_shows_the_failure_by_reason_the_steps_it_lost_and_escapes_its_message() -> None:
    state, events = a_run()
    view = RunView("r", state, goodput=measure(events, T0 + timedelta(hours=1)), vouched=Vouched("alice@lab"))
    html = pages.run_page(
        detail(view, judged(events), AuditReport(6, 1, [], {"r": "alice@lab"})), 6, T0 + timedelta(hours=1)
    )
    failure = re.search(r"<h2>Failures</h2>.*?</table>", html)
    assert failure is not None
    cells = [re.sub("<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", failure.group())]
    assert cells[2:5] == ["1", "hang", "1"]
    assert cells[6:] == ["20", "3"]  # saved step 20; the next attempt re-did 3 steps
    assert text(HOSTILE) in failure.group()
    assert "every chain intact and anchored; signed by alice@lab (1 run(s))" in html
    assert 'class="m-hang"' in html and 'class="m-resumed"' in html
    assert "\x1b" not in html and "\u202e" not in html


def test_a_rejected_record_and_a_broken_audit_read_so() -> None:
    state, events = a_run("fine")
    finding = Finding("r", 4, 4, "failed", "prev_hash does not match")
    view = RunView("r", state, broken=finding)
    html = pages.run_page(detail(view, judged(events, rejected=4), AuditReport(6, 1, [finding])), 6, T0)
    assert 'class="verdict bad"' in html and "BROKEN run r: seq 4 (failed, stream seq 4)" in html
    assert '<tr class="rejected">' in html and "REJECTED: prev_hash does not match" in html
    assert 'class="m-rejected"' in html


def test_the_event_page_shows_the_stored_event_escaped() -> None:
    _, events = a_run('</pre><script>alert("x")</script>')
    html = pages.event_page(verdicts(judged(events))[3], 6)
    assert "&lt;/pre&gt;&lt;script&gt;alert(\\&quot;x\\&quot;)&lt;/script&gt;" in html
    assert html.count("<pre>") == html.count("</pre>") == 1
    assert "signed by alice@lab" in html and f"{4:064x}" in html


def test_ten_thousand_checkpoints_are_one_path_and_the_rare_marks_stay_links() -> None:
    events = stamped(launched("r"), *(checkpointed("r", 10 * n) for n in range(1, 10_001)))
    svg = charts.timeline(judged(events), attempt_spans(events), "r", T0 + timedelta(days=8))
    assert svg.count("<path") == 1 and svg.count("<a ") == 1  # the launch
    assert len(svg) < 200_000


def test_the_goodput_bar_splits_the_wall_time_by_term() -> None:
    _, events = a_run()
    g = measure(events, events[-1].time)
    widths = [float(w) for w in re.findall(r'width="([\d.]+)"', charts.goodput_bar(g))[1:]]
    assert abs(sum(widths) - charts.WIDTH) < 0.1
    assert charts.stall_chart([]).startswith("<p")
    assert isinstance(events[-1], Checkpointed)
    assert 'class="stall"' in charts.stall_chart([events[-1]])


def test_a_run_page_shows_each_nodes_snapshot_part_and_its_replica_escaped() -> None:
    parts = (
        SnapshotPart(node=0, host=HOSTILE[:HOST_MAX], first_rank=0, ranks=2, size_bytes=30, replica_node=1),
        SnapshotPart(node=1, host="gpu-b", first_rank=2, ranks=2, size_bytes=50, replica_node=0),
    )
    snap = Snapshotted(run_id="r", step=25, epoch=2, shards=4, uri="file:///dev/shm/s", attempt=2,
                       checkpoint_hash="ab" * 32, size_bytes=80, parts=parts)  # fmt: skip
    ended = SnapshotReplicated(run_id="r", snapshot_seq=7, step=25, checkpoint_hash="ab" * 32, attempt=2,
                               replicas=(PartReplicas(node=0, landed=2),
                                         PartReplicas(node=1, landed=1, failed=1)))  # fmt: skip
    _, events = a_run()
    events = stamped(*events, snap, ended)
    view = RunView("r", fold(*events), vouched=Vouched("alice@lab"))
    html = pages.run_page(detail(view, judged(events), AuditReport(8, 1, [], {"r": "alice@lab"})), 8, T0)
    memory = re.search(r"<h2>Memory snapshot</h2>.*?</section>", html)
    assert memory is not None
    rows = [
        [re.sub("<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        for row in re.findall(r"<tr class=.*?</tr>", memory.group())
    ]
    assert (
        rows[0][0] == "0" and rows[0][1] == text(HOSTILE[:HOST_MAX]) and rows[0][2:4] == ["ranks 0-1", "30"]
    )
    assert rows[0][4] == "replica on node 1 (gpu-b): landed"
    assert rows[1][4].startswith("replica on node 0 (&lt;script&gt;") and rows[1][4].endswith(
        ": dropped (1 landed, 0 dropped, 1 failed)"
    )
    assert 'class="replica-landed"' in memory.group() and 'class="replica-dropped"' in memory.group()
    assert "<script>alert" not in html and "\x1b" not in html
