"""A real MLflow tracking server for tests (SQLite backend, free port, its own process group), and a reader
of W&B's offline run files (the records `wandb.init(mode="offline")` writes, as `wandb sync` reads them)."""

import json
import os
import signal
import struct
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import free_port

MLFLOW_UP_S = 120.0
WANDB_BLOCK = 32768
WANDB_HEADER = b":W&B"


class MlflowServer:
    """`mlflow server` on 127.0.0.1, its runs in a SQLite file under `root`."""

    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        mlflow = Path(sys.executable).with_name("mlflow")
        self.log = (root / "mlflow-server.log").open("wb")
        self.process = subprocess.Popen(
            [str(mlflow), "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
             "--default-artifact-root", str(root / "artifacts"), "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, cwd=root,
        )  # fmt: skip
        deadline = time.monotonic() + MLFLOW_UP_S
        while not self._healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"mlflow server did not come up: {(root / 'mlflow-server.log').read_text()}"
                )
            time.sleep(0.3)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=1) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def api(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST to MLflow's REST API; the answer."""
        request = urllib.request.Request(
            f"{self.uri}/api/2.0/mlflow/{endpoint}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            result: dict[str, Any] = json.loads(answer.read())
            return result

    def runs(self, experiment: str | None = None) -> list[dict[str, Any]]:
        """Every run of the experiment named by MLFLOW_EXPERIMENT_NAME, or of `experiment` (an id)."""
        if experiment is None:
            experiment = self.get(
                "experiments/get-by-name", experiment_name=os.environ["MLFLOW_EXPERIMENT_NAME"]
            )["experiment"]["experiment_id"]
        return list(self.api("runs/search", {"experiment_ids": [experiment]}).get("runs", []))

    def get(self, endpoint: str, **query: str) -> dict[str, Any]:
        """GET from MLflow's REST API; the answer."""
        url = f"{self.uri}/api/2.0/mlflow/{endpoint}?{urllib.parse.urlencode(query)}"
        with urllib.request.urlopen(url, timeout=10) as answer:
            result: dict[str, Any] = json.loads(answer.read())
            return result

    def metric(self, run_id: str, key: str) -> list[tuple[int, float]]:
        """A metric's history: (step, value) in the order logged."""
        found = self.get("metrics/get-history", run_id=run_id, metric_key=key).get("metrics", [])
        return [(int(m.get("step", 0)), float(m["value"])) for m in found]

    def stop(self) -> None:
        """The server and its workers (one process group)."""
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(3)  # it may not end on SIGTERM within seconds: then SIGKILL
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.log.close()


@pytest.fixture(scope="module")
def mlflow_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """One `mlflow server` for a module's tests (it takes 15 to 45 s to start here)."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def mlflow_server(
    mlflow_process: MlflowServer, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> MlflowServer:
    """The module's `mlflow server`, named by MLFLOW_TRACKING_URI, with an experiment of this test's own
    (MLFLOW_EXPERIMENT_NAME, created by the first run made in it): `runs()` lists only this test's runs."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_process.uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", request.node.name)
    return mlflow_process


def tags(run: dict[str, Any]) -> dict[str, str]:
    """An MLflow run's tags."""
    return {t["key"]: t["value"] for t in run["data"].get("tags", [])}


def wandb_records(path: Path) -> Iterator[Any]:
    """The protobuf records of a W&B run file (`run-<id>.wandb`): LevelDB-log framing, 32 KiB blocks, each
    record a 7-byte header (CRC, length, kind: 1 whole, 2 first, 3 middle, 4 last) and its bytes."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == WANDB_HEADER, data[:7]
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = WANDB_BLOCK - pos % WANDB_BLOCK
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            return
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record
