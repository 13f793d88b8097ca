"""The supervisor's MLflow client against a real `mlflow server` (SQLite backend): the run it creates once,
the experiment it finds or makes, what a write puts there, and a server that is down. Through `ftrain run`
with torchrun: tests/e2e/test_trackers.py."""

import socket
from datetime import UTC, datetime

import pytest

from ftrain.trackers import configured
from ftrain.trackers.mlflow_rest import MlflowServer as Client
from ftrain.trackers.mlflow_rest import MlflowTracker
from ftrain.trackers.tracker_port import TrackerDown, Write
from tests.support.trackers import MlflowServer, tags
from tests.support.trackers import mlflow_process as mlflow_process  # the fixtures
from tests.support.trackers import mlflow_server as mlflow_server


def test_a_run_is_created_once_in_the_named_experiment_and_written_to(
    mlflow_server: MlflowServer, capsys: pytest.CaptureFixture[str]
) -> None:
    server = mlflow_server
    env = {"MLFLOW_TRACKING_URI": server.uri, "MLFLOW_EXPERIMENT_NAME": "llm"}  # made by the first run
    created = configured.mlflow_run(env, None, "r1")
    assert created is not None
    assert configured.mlflow_run(env, created, "r1") == created  # recorded: reused, nothing created
    assert configured.mlflow_run({**env, "MLFLOW_RUN_ID": "users"}, None, "r1") == "users"
    client = configured.mlflow_server(env)
    assert client is not None
    [run] = server.runs(client.experiment_id())  # found by name now, not made again
    assert run["info"]["run_id"] == created and run["info"]["run_name"] == "r1"

    at = datetime(2026, 12, 5, tzinfo=UTC)
    MlflowTracker(client, created).write(
        Write(seq=2, at=at, step=10, tags={"ftrain.state": "running"}, metrics={"ftrain.checkpoint_step": 10})
    )
    [run] = server.runs(client.experiment_id())
    assert tags(run)["ftrain.state"] == "running"
    assert server.metric(created, "ftrain.checkpoint_step") == [(10, 10.0)]
    assert capsys.readouterr().err == ""


def test_a_server_that_is_down_creates_nothing_and_says_so_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    env = {"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}"}
    assert configured.mlflow_run(env, None, "r1") is None
    err = capsys.readouterr().err
    assert err.startswith("ftrain run: no MLflow run created, going on without one (MLflow runs/create:")
    assert err.count("\n") == 1
    with pytest.raises(TrackerDown):
        MlflowTracker(Client(env), "x").write(Write(seq=1, at=datetime.now(UTC), step=0))
    assert (
        configured.mlflow_run({"MLFLOW_TRACKING_URI": "file:///tmp/mlruns"}, None, "r1") is None
    )  # not ours to reach
