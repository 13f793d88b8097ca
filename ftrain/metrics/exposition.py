"""Runs' figures as Prometheus exposition: a collector over one snapshot, rendered at scrape time (no
global gauges to keep in step with the log). Pure: figures in, bytes out.

Every label value is bounded. `run_id` and `project` come from the log, so from whoever published there:
a value that is not a valid run id (letters, digits, `-`, `_`, at most 128) is replaced by its safe
characters, cut to 64, and a digest of the original (`x_y~3f9a…`), so two such names stay apart and no
quote, control or bidi character reaches a label. `state`, `reason` and `term` take values from closed sets.
"""

import hashlib
import re
from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector, CollectorRegistry

from ftrain.events.run_id import is_run_id
from ftrain.metrics.figures import STATES, RunFigures

BADPUT_TERMS = ("checkpoint_stall", "startup", "restart", "down", "recomputed", "other")
"""The `term` label of `ftrain_run_badput_seconds`: the goodput terms other than productive time."""
RUN_LABELS = ("run_id", "project")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def label(text: str) -> str:
    """A name from the log as a label value: itself when it is a valid run id, else bounded (see above)."""
    if not text or is_run_id(text):
        return text
    digest = hashlib.sha256(text.encode(errors="surrogatepass")).hexdigest()[:12]
    return f"{_UNSAFE.sub('_', text)[:64]}~{digest}"


class _Families:
    """The metric families of one scrape, filled run by run."""

    def __init__(self) -> None:
        def gauge(name: str, text: str, *extra: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, text, labels=(*RUN_LABELS, *extra))

        def counter(name: str, text: str, *extra: str) -> CounterMetricFamily:
            return CounterMetricFamily(name, text, labels=(*RUN_LABELS, *extra))

        self.state = gauge("ftrain_run_state", "1 for the run's state, 0 for the others", "state")
        self.broken = gauge(
            "ftrain_run_broken", "1 when the run's chain is broken or no trusted writer vouches for it"
        )
        self.step = gauge("ftrain_run_step", "The step of the run's newest checkpoint or resume")
        self.attempt = gauge("ftrain_run_attempt", "The run's current attempt (1: the launch's)")
        self.restarts = counter("ftrain_run_restarts", "Resumes recorded for the run")
        self.failures = counter("ftrain_run_failures", "Failures recorded for the run, by reason", "reason")
        self.ratio = gauge(
            "ftrain_run_goodput_ratio", "Productive time over wall time, launch to now or completion"
        )
        self.wall = gauge("ftrain_run_wall_seconds", "Wall time from launch to now or completion")
        self.productive = gauge("ftrain_run_productive_seconds", "Training time of the steps the run kept")
        self.badput = gauge("ftrain_run_badput_seconds", "Wall time not spent on kept steps, by term", "term")
        self.lost = counter("ftrain_run_lost_steps", "Steps trained again after resumes")
        self.age = gauge(
            "ftrain_run_last_valid_checkpoint_age_seconds",
            "Seconds since the newest valid checkpoint was recorded",
        )
        self.valid_step = gauge(
            "ftrain_run_last_valid_checkpoint_step", "The step of the newest valid checkpoint"
        )
        self.stall = gauge(
            "ftrain_run_last_checkpoint_stall_seconds",
            "How long the newest checkpoint's save held the training loop",
        )
        self.interval = gauge(
            "ftrain_run_checkpoint_interval_seconds",
            "The run's checkpoint cadence (a step count x seconds a step)",
        )
        self.running = gauge(
            "ftrain_run_attempt_running_seconds",
            "Seconds the current attempt has been running (running runs only)",
        )
        self.last_event = gauge(
            "ftrain_run_last_event_timestamp_seconds", "When the run's newest accepted event was recorded"
        )

    def add(self, f: RunFigures) -> None:
        names = [label(f.run_id), label(f.project)]
        for state in STATES:
            self.state.add_metric([*names, state], float(state == f.state))
        self.broken.add_metric(names, float(f.broken))
        self.restarts.add_metric(names, f.restarts)
        for reason, count in sorted(f.failures.items()):
            self.failures.add_metric([*names, reason], count)
        for family, value in (
            (self.step, f.step),
            (self.attempt, f.attempt),
            (self.age, f.last_valid_checkpoint_age),
            (self.valid_step, f.last_valid_checkpoint_step),
            (self.stall, f.last_stall),
            (self.interval, f.checkpoint_interval),
            (self.running, f.attempt_running),
            (self.last_event, f.last_event),
        ):
            if value is not None:
                family.add_metric(names, value)
        g = f.goodput
        if g is None:
            return
        self.wall.add_metric(names, g.wall)
        for family, value in ((self.ratio, g.ratio), (self.productive, g.productive)):
            if value is not None:
                family.add_metric(names, value)
        if g.lost_steps is not None:
            self.lost.add_metric(names, g.lost_steps)
        for term in BADPUT_TERMS:
            if (seconds := getattr(g, term)) is not None:
                self.badput.add_metric([*names, term], seconds)

    def __iter__(self) -> Iterator[Metric]:
        return iter(vars(self).values())


class RunsCollector(Collector):
    """The families of a fixed list of runs' figures (a registry holding it renders one snapshot)."""

    def __init__(self, figures: Sequence[RunFigures]) -> None:
        self.figures = figures

    def collect(self) -> Iterator[Metric]:
        families = _Families()
        for f in self.figures:
            families.add(f)
        return iter(families)


def render(figures: Sequence[RunFigures], accept: str | None = None) -> tuple[bytes, str]:
    """The exposition of `figures` and its Content-Type: Prometheus text, or OpenMetrics when `accept` (a
    request's Accept header) asks for it."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunsCollector(figures))
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type
