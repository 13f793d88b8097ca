"""`restart_report.md`: an analysed restart-cost experiment as Markdown tables. Pure: result in, text out."""

from collections.abc import Sequence

from ftrain.experiments.goodput_check import COMPARED, ESTIMATE_SHARE, ROUNDING_S
from ftrain.experiments.results import ExperimentResult, Overhead, PhaseResult

PLOT = "restart_plot.png"
REPORT = "restart_report.md"
DASH = "—"


def _s(value: float | None, digits: int = 1) -> str:
    return DASH if value is None else f"{value:.{digits}f}"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def _minutes(seconds: float | None) -> str:
    return DASH if seconds is None else f"{seconds / 60:.2f} min ({seconds:.1f} s)"


def stall_line(phase: PhaseResult) -> str:
    """`0.136 s (n=30)`, async as `0.004 s = stage 0.003 + drain 0.001 (n=30)`; with the memory tier,
    `; memory snapshot 0.002 s (n=120)` after it."""
    st = phase.stall
    snapshots = f"; memory snapshot {_s(st.median_snapshot, 3)} s (n={st.snapshots})" if st.snapshots else ""
    if phase.async_ckpt:
        return (
            f"{_s(st.median_total, 3)} s = stage {_s(st.median_stage, 3)} + drain {_s(st.median_drain, 3)} "
            f"(n={st.saves}){snapshots}"
        )
    return f"{_s(st.median_save, 3)} s (n={st.saves}){snapshots}"


def _summary(result: ExperimentResult) -> list[str]:
    baseline = result.phases[0]
    over = {o.phase: o for o in result.overheads}
    rows = []
    for p in result.phases:
        o = over.get(p.phase)
        rows.append(
            (
                p.phase,
                p.kind,
                str(len(p.failures)),
                _minutes(p.wall_seconds),
                _s(p.launch_to_completed),
                DASH if o is None else f"{o.overhead:+.1f} s",
                DASH if o is None or not o.failures else f"{o.overhead / o.failures:+.1f} s",
                stall_line(p),
                f"`{p.digest[:16]}…`" if p.digest else DASH,
                "baseline"
                if p is baseline
                else (
                    DASH if not (p.digest and baseline.digest) else str(p.digest == baseline.digest).lower()
                ),
            )
        )
    head = ("phase", "saves", "failures", "wall-clock", "launch → completed (s)", "overhead vs baseline",
            "per failure", "median stall per save", "final params_sha256", "= baseline")  # fmt: skip
    return [
        *_table(head, rows),
        "",
        "Wall-clock: from the first step's start to the last save (or the async drain) — the first start-up, "
        "the same work in every phase and the coldest in the first to run, is left out; launch → completed "
        "is the whole run as the log saw it.",
    ]


def _failures(p: PhaseResult) -> list[str]:
    bound = "" if p.lost_bound is None else f"Lost steps may not exceed {p.lost_bound}: "
    if bound and p.memory_every is not None:
        bound += (
            f"memory_every {p.memory_every} + the snapshot window ({p.snapshot_window_steps} steps from a "
            "snapshot's step to its `snapshotted` event); every resume must load from memory"
        )
    elif bound:
        bound += "the save interval"
    if bound and p.async_ckpt:
        bound += f" {p.save_interval} + the copy window ({p.copy_window_steps} steps from a save to its completion or to the kill that cut it short)"
    lines = [f"### {p.phase} ({p.kind} checkpointing) — run `{p.run_id}`", ""]
    if not p.failures:
        return [*lines, "No failures.", ""]
    rows = [
        (
            str(f.index),
            f.trigger,
            f"{f.kill_at:.1f}",
            DASH if f.newest_complete is None else str(f.newest_complete),
            str(f.resume_step),
            DASH if f.lost_steps is None else str(f.lost_steps),
            _s(f.restart_seconds, 2),
            _s(f.relaunch_seconds, 2),
            _s(f.recompute_seconds, 2),
            f.tier,
        )
        for f in p.failures
    ]
    head = ("#", "trigger", "kill at (s)", "newest complete at kill", "resume@step", "lost steps",
            "restart_seconds", "relaunch (s)", "recompute (s)", "tier")  # fmt: skip
    return [*lines, *_table(head, rows), "", f"{bound}." if bound else "", ""]


def _tiers(counts: dict[str, int]) -> str:
    """`memory 3, durable 1`; a dash for none."""
    return ", ".join(f"{tier} {n}" for tier, n in sorted(counts.items())) or DASH


def _span(values: list[float]) -> str:
    """`8.35–12.92`, one value alone, or a dash."""
    if not values:
        return DASH
    low, high = f"{min(values):.2f}", f"{max(values):.2f}"
    return low if low == high else f"{low}–{high}"


def side_by_side(p: PhaseResult) -> tuple[str, ...]:
    """One phase's failures at a glance: how many, served by which tier, what each lost, how long a
    restart took, and the goodput the log gives."""
    resumes: dict[str, int] = {}
    for f in p.failures:
        resumes[f.tier] = resumes.get(f.tier, 0) + 1
    lost = [f.lost_steps for f in p.failures]
    restarts = [f.restart_seconds for f in p.failures if f.restart_seconds is not None]
    log = p.goodput.log if p.goodput else None
    return (
        p.phase,
        p.kind,
        str(len(p.failures)),
        _tiers(resumes),
        ", ".join(DASH if n is None else str(n) for n in lost) or DASH,
        DASH if p.lost_bound is None or not p.failures else f"≤ {p.lost_bound}",
        DASH if log is None else _tiers(log.lost_by_tier),
        _span(restarts),
        _pct(log.ratio if log else None),
    )


def _side_by_side(result: ExperimentResult) -> list[str]:
    head = ("phase", "saves", "failures", "resumed from", "lost steps per failure", "bound",
            "lost steps by tier (log)", "restart_seconds", "goodput (log)")  # fmt: skip
    return [
        "What each failure cost, phase beside phase: the tier each resume loaded from (its `resumed` "
        "event), the steps each lost (`train/lost_steps`) against the phase's bound, goodput's lost steps "
        "by tier and its goodput, both from the event log alone.",
        "",
        *_table(head, [side_by_side(p) for p in result.phases]),
    ]


def _stalls(result: ExperimentResult) -> list[str]:
    rows = [
        (
            p.phase,
            p.kind,
            str(p.stall.saves),
            _s(p.stall.median_save, 3),
            _s(p.stall.median_stage, 3),
            _s(p.stall.median_drain, 3),
            _s(p.stall.median_total, 3),
            _s(p.stall.total, 2),
            _s(p.step_seconds, 3),
        )
        for p in result.phases
    ]
    head = ("phase", "saves", "n", "sync save (s)", "async stage (s)", "async drain (s)", "stall per save (s)",
            "total stall (s)", "median step (s)")  # fmt: skip
    lines = _table(head, rows)
    sync = next((p.stall.median_total for p in result.phases[1:] if not p.async_ckpt), None)
    async_ = next((p.stall.median_total for p in result.phases if p.async_ckpt), None)
    if sync and async_ is not None:
        lines += ["", f"Async stall per save = {async_ / sync:.3f}× sync (medians)."]
    return lines


def _costs(overheads: Sequence[Overhead]) -> list[str]:
    rows = []
    for o in overheads:
        n = max(o.failures, 1)
        share = f"{o.explained / o.overhead * 100:.0f} %" if o.overhead else DASH
        parts = (o.overhead, o.relaunch, o.restart, o.recompute, o.stall_delta, o.step_delta, o.residual)
        rows.append((o.phase, str(o.failures), *(f"{x / n:+.1f}" for x in parts), share))
    head = ("phase", "failures", "overhead", "relaunch", "restart", "recompute", "Δ save stall", "Δ step time",
            "residual", "explained")  # fmt: skip
    return [
        "Seconds per failure. Overhead: the phase's wall-clock − the baseline's, ÷ failures. Relaunch: kill → "
        "the new trainer process (teardown, `failed` recorded, backoff, torchrun's start); restart: "
        "`train/restart_seconds` (process start → end of the first step after the resume: imports, init, "
        "verify, load) less that first step; recompute: the killed attempt's time past the checkpoint it "
        "resumed from; Δ save stall: the phase's total save stall − the baseline's; Δ step time: the time of "
        "the steps that count − the baseline's (a save behind training, or a busy machine, slows them).",
        "",
        *_table(head, rows),
    ]


def _pct(ratio: float | None) -> str:
    return DASH if ratio is None else f"{ratio * 100:.1f} %"


def _goodput_row(p: PhaseResult) -> tuple[str, ...]:
    """`log / metrics` for each compared term; the log's own for the rest."""
    if p.goodput is None:
        return (p.phase, *(DASH for _ in range(len(COMPARED) + 5)))
    log, m = p.goodput.log, p.goodput.measured
    pairs = [f"{_pct(log.ratio)} / {_pct(m.ratio if m else None)}"]
    pairs += [f"{_s(getattr(log, t))} / {_s(getattr(m, t) if m else None)}" for t in COMPARED]
    lost = (DASH if v is None else str(v) for v in (log.lost_steps, m.lost_steps if m else None))
    return (p.phase, *pairs, " / ".join(lost), _s(log.down), _s(log.other), _s(log.wall))


def _goodput(result: ExperimentResult) -> list[str]:
    head = ("phase", "goodput", "productive (s)", "checkpoint stall (s)", "start-up (s)", "restart (s)",
            "recomputed (s)", "lost steps", "down (s)", "other (s)", "wall (s)")  # fmt: skip
    return [
        "Each cell: from the event log alone (what `ftrain cost --run RUN` prints) / measured from rank 0's "
        "metrics: the loop time of the steps kept (line to line, less the save stalls between), the stall lines "
        "up to each attempt's last recorded save, the first step's start after `launched` and after each "
        "opening `resumed`, the loop time of the steps thrown away, `train/lost_steps`. Down, other and wall "
        "are the log's (wall: `launched` → `completed`), so the goodput agrees when productive does. They must "
        f"be equal within rounding ({ROUNDING_S:g} s a term) and the lost steps exactly; recomputed, which the "
        f"log estimates from the mean seconds per step, within {ESTIMATE_SHARE:.0%} of the measured.",
        "",
        *_table(head, [_goodput_row(p) for p in result.phases]),
    ]


def markdown(result: ExperimentResult) -> str:
    """The whole report."""
    lines = [
        f"# {result.title}",
        "",
        *(f"- {note}" for note in result.notes),
        "",
        f"![restart plot]({PLOT})",
        "",
    ]
    lines += ["## Summary", "", *_summary(result), ""]
    lines += ["## Failures side by side", "", *_side_by_side(result), ""]
    lines += ["## Failures", "", *(line for p in result.phases for line in _failures(p))]
    lines += ["## Stall per save", "", *_stalls(result), ""]
    lines += ["## Cost per failure", "", *_costs(result.overheads), ""]
    lines += ["## Goodput: the log alone × the metrics", "", *_goodput(result), ""]
    lines += ["## Final parameters", ""]
    lines += [f"- {p.phase}: `{p.digest or DASH}` (step {p.final_step})" for p in result.phases]
    verdict = "equal to the baseline's" if result.digests_equal else "NOT all equal to the baseline's"
    lines += ["", f"Every phase's final parameters are {verdict}.", ""]
    lines += ["## Cross-check: event log × metrics × supervisor output × kill records", ""]
    if result.problems:
        lines += [f"- MISMATCH {problem}" for problem in result.problems]
    else:
        lines.append(
            "No mismatch. Checked: every kill has one `failed` and one `resumed` event; every `resumed` event "
            "a `RESUMED from step=` line and, unless it resumed at the last step, a `train/restart_seconds` line at "
            "the step after it; every resume "
            "started from the newest checkpoint complete at its kill (or memory snapshot recorded, if newer); "
            "every resume with the memory tier loaded from memory; no failure lost more steps than the "
            "bound; every chain verifies (checks that need the supervisor's output or the kill records are "
            "skipped where those are absent)."
        )
    return "\n".join(lines) + "\n"
