"""Prometheus for tests: `ftrain metrics` started as a user starts it, a real `prometheus` (Debian's) scraping it
with a config the test writes, its HTTP API, and the exposition turned into `promtool test rules` input."""

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.processes import free_port

Labels = tuple[tuple[str, str], ...]
Samples = dict[tuple[str, Labels], float]


def need_prometheus() -> None:
    """Skip (or, with FTRAIN_REQUIRE_PROMETHEUS=1, as in CI, fail) unless Debian's prometheus and promtool
    are installed (`apt-get install prometheus`)."""
    missing = [tool for tool in ("prometheus", "promtool") if shutil.which(tool) is None]
    if not missing:
        return
    why = f"{' and '.join(missing)} not installed (apt-get install prometheus)"
    if os.environ.get("FTRAIN_REQUIRE_PROMETHEUS") == "1":
        pytest.fail(f"Prometheus tests required (FTRAIN_REQUIRE_PROMETHEUS=1) but {why}")
    pytest.skip(why)


@contextlib.contextmanager
def ftrain_metrics(env: dict[str, str], *args: str) -> Iterator[dict[str, str]]:
    """`ftrain metrics --listen 127.0.0.1:0 --json ARGS` running; yields its first line (url, target,
    token_file), and stops it with SIGTERM, which must end it with exit 0."""
    script = Path(sys.executable).with_name("ftrain")
    proc = subprocess.Popen(
        [str(script), "metrics", "--listen", "127.0.0.1:0", "--json", *args],
        env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, f"ftrain metrics ended: {proc.wait(10)} {proc.stderr.read() if proc.stderr else ''}"
        yield json.loads(line)
    finally:
        proc.terminate()
        assert proc.wait(20) == 0


def get(url: str, token: str | None = None, accept: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """An HTTP GET: status, headers, body (an error status is returned, not raised)."""
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    if accept is not None:
        request.add_header("Accept", accept)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def samples(exposition: bytes) -> Samples:
    """Every sample of an exposition, by name and sorted labels, as Prometheus's text parser reads them."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(exposition.decode())
        for s in family.samples
    }


class Prometheus:
    """A running `prometheus` and its query API."""

    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector `expr` gives now (its `result`)."""
        code, _, body = get(f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
        doc = json.loads(body)
        assert code == 200 and doc["status"] == "success", (expr, doc)
        result: list[dict[str, Any]] = doc["data"]["result"]
        return result

    def wait_for(self, expr: str, timeout: float = 30) -> list[dict[str, Any]]:
        """`expr`'s result once it is not empty (AssertionError after `timeout`)."""
        deadline = time.monotonic() + timeout
        while not (result := self.query(expr)):
            assert time.monotonic() < deadline, f"no data for {expr!r} after {timeout} s"
            time.sleep(0.5)
        return result


@contextlib.contextmanager
def prometheus(directory: Path, target: str, token_file: str, rules: Path) -> Iterator[Prometheus]:
    """`prometheus` scraping `target` every second with the bearer token in `token_file`, evaluating `rules`,
    its database in `directory`."""
    config = directory / "prometheus.yml"
    config.write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": "ftrain", "authorization": {"credentials_file": token_file},
                            "static_configs": [{"targets": [target]}]}],
    }))  # fmt: skip
    port = free_port()
    log = (directory / "prometheus.log").open("w")
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={directory / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError):
                if get(f"{url}/-/ready")[0] == 200:
                    break
            assert proc.poll() is None, (directory / "prometheus.log").read_text()
            assert time.monotonic() < deadline, "prometheus did not get ready in 30 s"
            time.sleep(0.2)
        yield Prometheus(url)
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()


def series_text(name: str, labels: Labels) -> str:
    """`name{a="x",b="y"}` as promtool's input series take it (an empty value is no label, as in Prometheus)."""
    inner = ",".join(f'{k}="{v}"' for k, v in labels if v)
    return f"{name}{{{inner}}}"
