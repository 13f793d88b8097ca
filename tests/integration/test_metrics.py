"""`ftrain metrics` against a real log, a real Prometheus and promtool: the exposition says what the log
implies; a request without the token gets 401 and nothing else; Prometheus scrapes it with the token file and
every panel of the shipped dashboard has data; the shipped rules pass `promtool check rules` and fire, under
`promtool test rules`, on series derived from the same run's scrapes."""

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from ftrain.events.jetstream.nats_server import ServerProcess
from ftrain.events.record import run_subject
from ftrain.events.schema import now
from ftrain.metrics.exposition import BADPUT_TERMS
from ftrain.metrics.scrape import Scraper
from ftrain.service import RunService
from tests.integration.test_failures import one_line, raw_publish
from tests.integration.test_goodput_cli import store
from tests.support.cli import Cli, checkpoint
from tests.support.processes import ftrain_process, modules_imported_by
from tests.support.prometheus import (
    Labels,
    Samples,
    ftrain_metrics,
    get,
    need_prometheus,
    prometheus,
    samples,
    series_text,
)
from tests.unit.test_goodput import failed_and_resumed

pytestmark = pytest.mark.timeout(240)
PACKAGE = Path(__file__).parents[2] / "ftrain" / "metrics"
RULES = PACKAGE / "ftrain.rules.yml"
DASHBOARD = PACKAGE / "grafana-dashboard.json"
RATIO = "ftrain_run_goodput_ratio"
HOSTILE = '<script>alert(1)</script>"\n\u202e\x07'


def test_the_metrics_never_import_torch_and_other_commands_never_import_prometheus_client() -> None:
    served = {"ftrain.metrics.scrape", "ftrain.cli.metrics_cmd", "ftrain.cli.metrics_http"}
    loaded = modules_imported_by(served)
    assert served <= loaded and "prometheus_client" in loaded
    assert not {m for m in loaded if m.partition(".")[0] == "torch"}
    code = (
        "import sys; from ftrain.cli.main import build_parser; build_parser(); print(' '.join(sys.modules))"
    )
    parsing = set(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.split()
    )
    assert "ftrain.cli.metrics_cmd" in parsing  # the parser is built for every command, and no more
    assert not parsing & {
        "prometheus_client",
        "http.server",
        "ftrain.cli.metrics_http",
        "ftrain.metrics",
        "asyncio",
    }


def test_bad_input_is_refused_in_one_line_before_anything_listens(
    env: dict[str, str], tmp_path: Path
) -> None:
    shared = tmp_path / "shared.token"
    shared.write_text("a-token-others-can-read-0123456789\n")
    shared.chmod(0o644)
    empty = tmp_path / "empty.token"
    empty.touch(mode=0o600)
    fifo = tmp_path / "fifo.token"
    os.mkfifo(fifo, 0o600)
    for args, says in (
        (["--listen", "localhost"], "is not HOST:PORT"),
        (["--listen", "127.0.0.1:70000"], "is not HOST:PORT"),
        (["--token-file", str(shared)], "readable or writable by others (mode 644): chmod 600 it"),
        (["--token-file", str(empty)], "holds no token"),
        (["--token-file", str(fifo)], "not a regular file of this user's"),
        (["--token-file", str(tmp_path / "absent" / "t")], "No such file or directory"),
    ):
        refused = ftrain_process(["metrics", *args], env)
        assert refused.returncode == 2 and refused.stdout == "", refused
        assert says in one_line(refused.stderr)
    assert not (Path(env["FTRAIN_HOME"]) / "metrics.token").exists()


async def test_each_scrape_reads_what_was_appended_since_and_counts_it_once(
    cli: Cli, app: RunService
) -> None:
    scrape_ = Scraper(app)

    async def failures() -> dict[str, float]:
        got = samples((await scrape_())[0])
        return {dict(k[1])["reason"]: v for k, v in got.items() if k[0] == "ftrain_run_failures_total"}

    await asyncio.to_thread(
        cli.ok, "launch", "vision", "--run-id", "again", "--nodes", "1", "--gpus-per-node", "1"
    )
    await asyncio.to_thread(checkpoint, cli, 10, 1, "again")
    await asyncio.to_thread(cli.ok, "fail", "again", "--reason", "preempted")
    assert await failures() == {"preempted": 1}
    await asyncio.to_thread(cli.ok, "resume", "again")
    await asyncio.to_thread(cli.ok, "fail", "again", "--reason", "node-failure")
    assert await failures() == {"preempted": 1, "node-failure": 1}
    await app.rebuild()  # the model emptied and replayed: the scraper walks the log again, from its start
    assert await failures() == {"preempted": 1, "node-failure": 1}


def build_log(cli: Cli, env: dict[str, str], server: ServerProcess) -> None:
    """Three runs: `stuck`, driven through the CLI (two failures, two resumes, running at step 200 with a
    10-minute cadence); `r`, a trainer's run with its measured figures (failed, resumed, running); and
    `forged`, whose only event no writer of ftrain's would publish; and `stranger`, launched by a user this one
    does not trust (its own signing key, in another home)."""
    cli.ok("launch", "vision", "--run-id", "stuck", "--nodes", "1", "--gpus-per-node", "2",
           "--checkpoint-every", "10min")  # fmt: skip
    checkpoint(cli, 100, 1, run_id="stuck")
    cli.ok("fail", "stuck", "--reason", "preempted")
    cli.ok("resume", "stuck")
    checkpoint(cli, 200, 2, run_id="stuck")
    cli.ok("fail", "stuck", "--reason", "oom", "--message", HOSTILE)
    cli.ok("resume", "stuck")
    trained = failed_and_resumed().events[:-1]  # not completed: still running
    shift = now() - timedelta(seconds=60) - trained[-1].time
    store(env, [msgspec.structs.replace(e, time=e.time + shift) for e in trained])
    asyncio.run(raw_publish(server, run_subject("forged", "launched"), b'{"forged": true}'))
    elsewhere = {**env, "FTRAIN_HOME": str(Path(env["FTRAIN_HOME"]).with_name("stranger-home"))}
    launched = ftrain_process(
        ["launch", "vision", "--run-id", "stranger", "--nodes", "1", "--gpus-per-node", "1"], elsewhere
    )
    assert launched.returncode == 0, launched.stderr


def scrape(serving: dict[str, str]) -> bytes:
    token = Path(serving["token_file"]).read_text().strip()
    code, headers, body = get(serving["url"], token)
    assert code == 200 and headers["Content-Type"].startswith("text/plain; version="), (code, body)
    return body


def value(got: Samples, name: str, **labels: str) -> float | None:
    return got.get((name, tuple(sorted(labels.items()))))


def test_the_exposition_says_what_the_log_implies_and_only_to_the_token(
    cli: Cli, env: dict[str, str], server: ServerProcess
) -> None:
    build_log(cli, env, server)
    with ftrain_metrics(env) as serving:
        token_file = Path(serving["token_file"])
        assert token_file == Path(env["FTRAIN_HOME"]) / "metrics.token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        for token in (None, "wrong-token-of-enough-length"):
            code, headers, body = get(serving["url"], token)
            assert code == 401 and b"ftrain_" not in body and b"stuck" not in body
            assert headers["WWW-Authenticate"].startswith("Bearer")
        token = token_file.read_text().strip()
        assert get(serving["url"].replace("/metrics", "/runs"), token)[0] == 404
        body = scrape(serving)
        got = samples(body)
    stuck = {"run_id": "stuck", "project": "vision"}
    assert value(got, "ftrain_run_state", **stuck, state="running") == 1
    assert value(got, "ftrain_run_broken", **stuck) == 0
    assert (value(got, "ftrain_run_step", **stuck), value(got, "ftrain_run_attempt", **stuck)) == (200, 3)
    assert value(got, "ftrain_run_restarts_total", **stuck) == 2
    assert value(got, "ftrain_run_failures_total", **stuck, reason="preempted") == 1
    assert value(got, "ftrain_run_failures_total", **stuck, reason="oom") == 1
    assert value(got, "ftrain_run_checkpoint_interval_seconds", **stuck) == 600
    assert value(got, "ftrain_run_last_valid_checkpoint_step", **stuck) == 200
    assert value(got, "ftrain_run_goodput_ratio", **stuck) is None  # `ftrain checkpoint` measures no training
    r = {"run_id": "r", "project": "p"}
    assert value(got, "ftrain_run_last_checkpoint_stall_seconds", **r) == 1.0
    assert value(got, "ftrain_run_lost_steps_total", **r) == 4
    assert value(got, "ftrain_run_productive_seconds", **r) == 18.0
    assert {
        t for t in BADPUT_TERMS if value(got, "ftrain_run_badput_seconds", **r, term=t) is not None
    } == set(BADPUT_TERMS)
    assert value(got, "ftrain_run_broken", run_id="forged", project="") == 1
    assert value(got, "ftrain_run_state", run_id="forged", project="", state="broken") == 1
    stranger = {"run_id": "stranger", "project": "vision"}  # unvouched: shown broken, as `status` shows it
    assert (value(got, "ftrain_run_broken", **stranger), value(got, "ftrain_run_step", **stranger)) == (1, 0)
    assert value(got, "ftrain_run_state", **stranger, state="broken") == 1
    assert HOSTILE.encode() not in body and b"<script>" not in body


def test_prometheus_scrapes_it_and_every_dashboard_panel_has_data(
    cli: Cli, env: dict[str, str], server: ServerProcess, tmp_path: Path
) -> None:
    need_prometheus()
    build_log(cli, env, server)
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [
        (p["title"], t["expr"].replace("$project", ".*")) for p in dashboard["panels"] for t in p["targets"]
    ]
    with (
        ftrain_metrics(env) as serving,
        prometheus(tmp_path, serving["target"], serving["token_file"], RULES) as prom,
    ):
        up = prom.wait_for('up{job="ftrain"} == 1')
        assert up[0]["value"][1] == "1"
        assert prom.wait_for('ftrain_run_step{run_id="stuck"}')[0]["value"][1] == "200"
        running = prom.query('ftrain_run_state{run_id="stuck", state="running"}')
        assert [s["value"][1] for s in running] == ["1"]
        failures = prom.query('ftrain_run_failures_total{run_id="stuck"}')
        assert {s["metric"]["reason"]: s["value"][1] for s in failures} == {"preempted": "1", "oom": "1"}
        assert prom.query('ftrain_run_broken{run_id="forged"}')[0]["value"][1] == "1"
        for title, expr in exprs:
            assert prom.wait_for(expr, timeout=20), title
    variable = dashboard["templating"]["list"][0]["definition"]
    assert variable == "label_values(ftrain_run_state, project)"


def test_the_rules_pass_promtool_and_fire_on_series_from_a_real_run(
    cli: Cli, env: dict[str, str], server: ServerProcess, tmp_path: Path
) -> None:
    need_prometheus()
    shipped = ftrain_process(["metrics", "--rules"], env)
    assert (
        shipped.returncode == 0 and shipped.stdout == RULES.read_text()
    )  # as installed, not only as checked out
    check = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    build_log(cli, env, server)
    with ftrain_metrics(env) as serving:
        first = samples(scrape(serving))
        time.sleep(1.5)
        second = samples(scrape(serving))
    growing = steady_or_growing(first, second)
    tests = tmp_path / "ftrain.rules.test.yml"
    tests.write_text(json.dumps(promtool_tests(first, growing)))
    ran = subprocess.run(["promtool", "test", "rules", str(tests)], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stdout + ran.stderr


def steady_or_growing(first: Samples, second: Samples) -> set[tuple[str, Labels]]:
    """The series that grew between two scrapes with no event between them. Every one of them grew by the
    same amount (the time between the scrapes: ages and wall time), the goodput ratios are productive over
    wall time still, and every other series stayed as it was: so a run left alone for hours is these series
    growing a second a second, its ratio falling with them, the rest constant."""
    assert first.keys() == second.keys()
    grown = {key: second[key] - first[key] for key in first if second[key] != first[key] and key[0] != RATIO}
    assert grown and max(grown.values()) - min(grown.values()) < 1e-6, grown
    assert min(grown.values()) > 0
    names = {name for name, _ in grown}
    assert names == {
        "ftrain_run_wall_seconds", "ftrain_run_badput_seconds", "ftrain_run_attempt_running_seconds",
        "ftrain_run_last_valid_checkpoint_age_seconds",
    }, names  # fmt: skip
    for scraped in (first, second):
        assert all(
            v == pytest.approx(ratio_of(scraped, labels)) for (n, labels), v in scraped.items() if n == RATIO
        )
    return set(grown)


def ratio_of(scraped: Samples, labels: Labels, later: float = 0.0) -> float:
    """A run's goodput ratio from its productive and wall time, `later` seconds on with no event."""
    return scraped[("ftrain_run_productive_seconds", labels)] / (
        scraped[("ftrain_run_wall_seconds", labels)] + later
    )


def promtool_tests(scraped: Samples, growing: set[tuple[str, Labels]]) -> dict[str, Any]:
    """A `promtool test rules` file: the scraped series as Prometheus stores them (job and instance added),
    one sample a minute for 5 hours with no further event, and the alerts each rule must raise, and when."""
    target = {"job": "ftrain", "instance": "127.0.0.1:9478"}
    series = []
    for (name, labels), v in sorted(scraped.items()):
        full = tuple(sorted({**dict(labels), **target}.items()))
        if name == RATIO:
            values = " ".join(repr(ratio_of(scraped, labels, 60 * i)) for i in range(301))
        else:
            values = f"{v!r}+60x300" if (name, labels) in growing else f"{v!r}x300"
        series.append({"series": series_text(name, full), "values": values})
    alerts = {rule["alert"]: rule for group in yaml.safe_load(RULES.read_text())["groups"]
              for rule in group["rules"] if "alert" in rule}  # fmt: skip

    def fired(alert: str, run: str, project: str, **extra: str) -> dict[str, Any]:
        labels = {**target, "run_id": run, **({"project": project} if project else {}), **extra}
        rule = alerts[alert]
        return {
            "exp_labels": {**labels, **rule["labels"]},
            "exp_annotations": {k: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m[1]], text)
                                for k, text in rule["annotations"].items()},
        }  # fmt: skip

    broken = [fired("FtrainRunBroken", "forged", ""), fired("FtrainRunBroken", "stranger", "vision")]
    expected = {
        # 20 minutes on: only the forged and the unvouched run
        "20m": {"FtrainRunBroken": broken, "FtrainCheckpointOverdue": [],
                "FtrainGoodputLow": [], "FtrainRunNoProgress": []},
        # 2.5 hours on: `stuck` is 3 cadences (30 min) past its last valid checkpoint, neither running run has
        # moved a step for 2 hours, and `r` trained nothing it kept in the hours seen
        "150m": {
            "FtrainRunBroken": broken,
            "FtrainCheckpointOverdue": [fired("FtrainCheckpointOverdue", "stuck", "vision")],
            "FtrainGoodputLow": [fired("FtrainGoodputLow", "r", "p")],
            "FtrainRunNoProgress": [fired("FtrainRunNoProgress", "r", "p", state="running"),
                                    fired("FtrainRunNoProgress", "stuck", "vision", state="running")],
        },
    }  # fmt: skip
    cases = [{"eval_time": at, "alertname": name, "exp_alerts": exp}
             for at, by_name in expected.items() for name, exp in by_name.items()]  # fmt: skip
    assert set(alerts) == {c["alertname"] for c in cases}  # every shipped alert is exercised
    return {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": cases}],
    }
