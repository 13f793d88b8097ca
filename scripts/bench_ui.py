"""The web view's figures: first paint of the runs list and of a 10,000-event run's page in headless Chromium
(cold: the first request walks the run's records and checks each signature; warm: read on from there), and
the server's time and bytes for each page over plain HTTP. Not a timed test: docs/benchmarks.md records the
figures, dated.

    .venv/bin/python scripts/bench_ui.py [--events 10000] [--json FILE]

It starts its own nats-server, publishes one run of `--events` signed events (tests/support/big_run.py) and
the control-plane demo's run, serves them with `ftrain ui`, and drives Debian's `chromium` over the DevTools
pipe (tests/support/browser.py).
"""

import argparse
import asyncio
import http.client
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the test support modules it shares with the e2e test

from ftrain.events.jetstream.nats_server import throwaway_server  # noqa: E402
from ftrain.service import RunService  # noqa: E402
from tests.support.big_run import long_run, publish  # noqa: E402
from tests.support.browser import Browser  # noqa: E402
from tests.support.servers import login  # noqa: E402
from tests.support.ui_server import Ui, serving  # noqa: E402

RUN = "long-run"


def fetch(ui: Ui, path: str) -> tuple[float, int]:
    """Seconds to the last byte and bytes of one page over HTTP (bearer token)."""
    conn = http.client.HTTPConnection(urlsplit(ui.base).netloc, timeout=120)
    started = time.perf_counter()
    conn.request("GET", path, headers={"Authorization": f"Bearer {ui.token}"})
    reply = conn.getresponse()
    body = reply.read()
    took = time.perf_counter() - started
    conn.close()
    assert reply.status == 200, (path, reply.status)
    return took, len(body)


def paint(browser: Browser, url: str) -> dict[str, float]:
    """Open `url`; its first contentful paint and load end (ms from navigation start), and transfer bytes."""
    browser.open(url)
    return dict(
        browser.evaluate(
            "new Promise(done => { const n = performance.getEntriesByType('navigation')[0];"
            " const said = fcp => done({fcp_ms: fcp, load_ms: n.loadEventEnd, bytes: n.transferSize});"
            " new PerformanceObserver(l => said(l.getEntries()[0].startTime))"
            ".observe({type: 'paint', buffered: true}); setTimeout(() => said(-1), 5000); })"
        )
    )


def measure(events: int, work: Path) -> dict[str, object]:
    with throwaway_server(work / "server") as server:
        env = {"FTRAIN_HOME": str(work / "home"), **login(server), "FTRAIN_STORAGE": str(work / "ckpt")}
        os.environ.update(env)

        async def build() -> None:
            async with RunService.open(env):
                pass  # the stream
            await publish(server.url, server.nkey_file, long_run(work / "home", RUN, events))

        asyncio.run(build())
        demo = subprocess.run([str(Path(sys.executable).with_name("ftrain")), "demo", "--log-only"],
                              env={**os.environ, **env}, capture_output=True, text=True, check=False)  # fmt: skip
        assert demo.returncode == 0, demo.stderr
        figures: dict[str, object] = {}
        with serving(env) as ui:
            browser = Browser(work / "profile")
            try:
                figures["list_cold"] = paint(browser, ui.url)
                figures["run_cold"] = paint(browser, f"{ui.base}/runs/{RUN}")
                figures["run_warm"] = paint(browser, f"{ui.base}/runs/{RUN}")
                figures["list_warm"] = paint(browser, f"{ui.base}/")
            finally:
                browser.close()
            for name, path in (("list", "/"), ("run", f"/runs/{RUN}"), ("run_all", f"/runs/{RUN}?all=1")):
                tries = [fetch(ui, path) for _ in range(5)]
                figures[f"http_{name}"] = {
                    "median_s": round(statistics.median(t for t, _ in tries), 4),
                    "bytes": tries[0][1],
                }
        return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ui-") as tmp:
        figures = measure(args.events, Path(tmp))
    doc = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
        "events": args.events,
        **figures,
    }
    print(json.dumps(doc, indent=2))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
