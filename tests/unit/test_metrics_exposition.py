"""A run's figures and their Prometheus exposition (`ftrain.metrics.figures`, `ftrain.metrics.exposition`):
every series from a legal run's events, parsed back as Prometheus parses it; bounded labels whatever a
publisher put in the log; a broken run's gauge. Against a real Prometheus: tests/integration/test_metrics.py."""

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ftrain.domain.chain_walk import Finding
from ftrain.events.schema import CheckpointPolicy, Failed
from ftrain.metrics.exposition import label, render
from ftrain.metrics.figures import REASONS, RunFigures, figures_of
from ftrain.service.run_queries import RunView
from tests.support.prometheus import Samples
from tests.support.prometheus import samples as parse
from tests.unit.test_goodput import RUN, Log, at, failed_and_resumed, first_attempt


def samples(figures: list[RunFigures]) -> Samples:
    body, content_type = render(figures)
    assert content_type.startswith("text/plain; version=")
    return parse(body)


def launched_with(**changes: object) -> Log:
    """A new run's log whose `launched` carries `changes`."""
    log = Log()
    first = msgspec.structs.replace(log.events[0], **changes)
    log.events, log.state = [], None
    log.add(first, 0)
    return log


def of(log: Log, seconds: float, broken: Finding | None = None) -> RunFigures:
    assert log.state is not None
    return figures_of(RunView(RUN, log.state, broken), log.events, at(seconds))


def test_a_failed_and_resumed_run_exports_every_figure_its_events_give() -> None:
    got = samples([of(failed_and_resumed(), 50)])
    run = (("project", "p"), ("run_id", RUN))

    def value(name: str, **extra: str) -> float | None:
        return got.get((name, tuple(sorted((*run, *extra.items())))))

    assert [value("ftrain_run_state", state=s) for s in ("running", "failed", "completed", "broken")] == [
        0,
        0,
        1,
        0,
    ]
    assert (value("ftrain_run_broken"), value("ftrain_run_step"), value("ftrain_run_attempt")) == (0, 30, 2)
    assert value("ftrain_run_restarts_total") == 1
    assert value("ftrain_run_failures_total", reason="preempted") == 1
    assert value("ftrain_run_failures_total", reason="oom") is None  # reasons with none are left out
    assert value("ftrain_run_goodput_ratio") == 18 / 38
    assert (value("ftrain_run_wall_seconds"), value("ftrain_run_productive_seconds")) == (38, 18)
    assert {t: value("ftrain_run_badput_seconds", term=t) for t in
            ("checkpoint_stall", "startup", "restart", "down", "recomputed")} == {
        "checkpoint_stall": 3.0, "startup": 5.0, "restart": 5.0, "down": 2.6, "recomputed": 2.4 * 1.0,
    }  # fmt: skip
    assert value("ftrain_run_badput_seconds", term="other") == pytest.approx(38 - 18 - 3 - 5 - 5 - 2.6 - 2.4)
    assert value("ftrain_run_lost_steps_total") == 4
    assert value("ftrain_run_last_checkpoint_stall_seconds") == 1.0
    assert (
        value("ftrain_run_last_valid_checkpoint_step"),
        value("ftrain_run_last_valid_checkpoint_age_seconds"),
    ) == (30, 50 - 37)
    assert value("ftrain_run_last_event_timestamp_seconds") == at(38).timestamp()
    # completed: no running attempt; launched without --checkpoint-every: no cadence
    assert value("ftrain_run_attempt_running_seconds") is None
    assert value("ftrain_run_checkpoint_interval_seconds") is None


def test_a_running_run_has_its_attempts_age_and_a_step_cadence_in_seconds() -> None:
    log = launched_with(checkpoint_policy=CheckpointPolicy(text="10steps", steps=10))
    first_attempt(log)
    got = samples([of(log, 100)])
    key = (("project", "p"), ("run_id", RUN))
    assert got[("ftrain_run_attempt_running_seconds", key)] == 100  # running since its launch
    assert got[("ftrain_run_checkpoint_interval_seconds", key)] == 10 * 0.6  # 10 steps × 0.6 s a step
    assert got[("ftrain_run_state", (*key, ("state", "running")))] == 1


def test_labels_from_the_log_are_bounded_and_reasons_come_from_a_closed_set() -> None:
    hostile = 'evil"\n<script>\u202e\x07' + "x" * 300
    log = launched_with(project=hostile)
    first_attempt(log)
    log.add(Failed(run_id=RUN, reason='<script>alert(1)</script>"\n', attempt=1), 25)
    figures = of(log, 30)
    body = render([figures])[0].decode()
    assert "\u202e" not in body and "<script>" not in body and "\x07" not in body
    projects = {s.labels["project"] for f in text_string_to_metric_families(body) for s in f.samples}
    assert projects == {label(hostile)}
    bounded = label(hostile)
    assert len(bounded) <= 64 + 13 and bounded.startswith("evil_") and "~" in bounded
    assert label(hostile + "y") != bounded  # two names cut alike stay apart
    assert label(RUN) == RUN and label("dist-JPCP-2x4-fsdp") == "dist-JPCP-2x4-fsdp"
    reasons = {s.labels.get("reason") for f in text_string_to_metric_families(body) for s in f.samples} - {
        None
    }
    assert reasons == {"other"} and reasons <= set(REASONS)


def test_a_broken_run_turns_its_gauge_on_and_shows_broken_whatever_it_folded_to() -> None:
    finding = Finding(RUN, 9, 4, "failed", "its hash does not match")
    folded = of(failed_and_resumed(), 50, broken=finding)
    ghost = figures_of(RunView("ghost", None, finding), [], at(50))
    got = samples([folded, ghost])
    assert got[("ftrain_run_broken", (("project", "p"), ("run_id", RUN)))] == 1
    assert got[("ftrain_run_state", (("project", "p"), ("run_id", RUN), ("state", "broken")))] == 1
    assert got[("ftrain_run_state", (("project", "p"), ("run_id", RUN), ("state", "completed")))] == 0
    assert got[("ftrain_run_broken", (("project", ""), ("run_id", "ghost")))] == 1
    assert {name for name, labels in got if dict(labels)["run_id"] == "ghost"} == {
        "ftrain_run_broken",
        "ftrain_run_state",
        "ftrain_run_restarts_total",
    }


def test_openmetrics_when_the_scraper_asks_for_it() -> None:
    body, content_type = render([of(failed_and_resumed(), 50)], "application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")
