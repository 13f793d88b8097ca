"""The user's tracker run continues across attempts and requeues, and ftrain writes the run's lifecycle into
it: a real `mlflow server` (SQLite), W&B in offline mode (its run files read back), real torchrun and the
stand-in trainer, whose rank 0 calls `mlflow.start_run()` and `wandb.init()` with no id. Pure parts:
tests/unit/test_trackers.py."""

import json
import re
import socket
from pathlib import Path

import pytest

from ftrain.trackers.cursor import Cursors, cursor_path
from tests.support.builders import SIGNER
from tests.support.cli import Cli
from tests.support.stand_in_trainer import ONE_GPU, RUN, TRAINER
from tests.support.stand_in_trainer import cli as cli  # the fixtures
from tests.support.trackers import MlflowServer, tags, wandb_records
from tests.support.trackers import mlflow_process as mlflow_process  # the fixtures
from tests.support.trackers import mlflow_server as mlflow_server

SECRET = "do-not-send-9f2c"
TRACKED = """
import json, os, sys
from pathlib import Path

if os.environ["RANK"] == "0":
    import mlflow, wandb

    here = Path(sys.argv[1])
    start = int((here / "starts").read_text()) + 1 if (here / "starts").exists() else 1
    mlflow.start_run()  # no id: MLFLOW_RUN_ID, from ftrain, continues the run
    mlflow.log_metric("user.attempt", start, step=start)
    run = wandb.init(project="p", dir=str(here), mode="offline")
    run.log({"user.attempt": start})
    with (here / "trackers.jsonl").open("a") as f:
        f.write(json.dumps({"mlflow": mlflow.active_run().info.run_id, "wandb": run.id}) + "\\n")
"""


@pytest.fixture
def tracked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """The stand-in trainer, its rank 0 using both trackers first; a credential in its environment."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    script = tmp_path / "trainer.py"
    script.write_text(TRACKED + TRAINER)
    state = tmp_path / "trainer-state"
    state.mkdir()
    return script, state


def identities(state: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in (state / "trackers.jsonl").read_text().splitlines()]


def log_events(cli: Cli, run_id: str) -> list[dict[str, object]]:
    return [entry["event"] for entry in json.loads(cli.ok("replay", run_id, "--json")[0])]


def test_a_run_killed_twice_is_one_tracker_run_with_ftrains_lifecycle(
    cli: Cli, mlflow_server: MlflowServer, tracked: tuple[Path, Path]
) -> None:
    script, state = tracked
    code, _, err = cli(
        "run",
        "P",
        *ONE_GPU,
        "--backoff",
        "0",
        "--",
        str(script),
        str(state),
        "ckpt+kill",
        "ckpt+kill",
        "ckpt",
    )
    assert code == 0, err
    seen = identities(state)
    assert len(seen) == 3 and {s["wandb"] for s in seen} == {RUN}
    [run] = mlflow_server.runs()  # one MLflow run holds every attempt
    run_id = run["info"]["run_id"]
    assert {s["mlflow"] for s in seen} == {run_id}
    events = log_events(cli, RUN)
    assert events[0]["mlflow_run_id"] == run_id
    assert [e["mlflow_run_id"] for e in events if e["type"] == "resumed"] == [run_id, run_id]
    assert mlflow_server.metric(run_id, "user.attempt") == [(1, 1.0), (2, 2.0), (3, 3.0)]

    found = tags(run)
    ours = {k: v for k, v in found.items() if k.startswith("ftrain.")}
    assert ours["ftrain.run_id"] == RUN and ours["ftrain.state"] == "completed"
    assert ours["ftrain.signer"] == SIGNER and ours["ftrain.attempt"] == "3"
    assert ours["ftrain.checkpoint_uri"].endswith(f"/{RUN}/step-30")
    assert re.fullmatch(r"[0-9a-f]{64}", ours["ftrain.checkpoint_hash"])
    assert set(ours) == {
        "ftrain.run_id", "ftrain.state", "ftrain.signer", "ftrain.attempt", "ftrain.checkpoint_uri",
        "ftrain.checkpoint_hash",
    }  # fmt: skip
    assert SECRET not in json.dumps(run)  # the supervisor's environment never reaches the tracker
    assert [v for _, v in mlflow_server.metric(run_id, "ftrain.checkpoint_step")] == [10.0, 20.0, 30.0]
    assert mlflow_server.metric(run_id, "ftrain.failure_step") == [(10, 10.0), (20, 20.0)]
    assert mlflow_server.metric(run_id, "ftrain.resume_step") == [(10, 10.0), (20, 20.0)]
    assert [v for _, v in mlflow_server.metric(run_id, "ftrain.attempt")] == [2.0, 3.0]

    # W&B offline: one directory per attempt, all of one run id; a SIGKILLed attempt's buffered records are
    # lost (W&B's offline writer buffers until its process ends), the finished one's carry the run and history
    runs = sorted((state / "wandb").glob("offline-run-*"))
    assert len(runs) == 3 and all(d.name.endswith(f"-{RUN}") for d in runs)
    records = list(wandb_records(runs[-1] / f"run-{RUN}.wandb"))
    assert {r.run.run_id for r in records if r.WhichOneof("record_type") == "run"} == {RUN}
    history = [
        {("/".join(i.nested_key) or i.key): i.value_json for i in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    assert [h["user.attempt"] for h in history] == ["3"]


def test_a_requeued_run_finds_its_tracker_run_in_the_log(
    cli: Cli, mlflow_server: MlflowServer, tracked: tuple[Path, Path]
) -> None:
    script, state = tracked
    args = ("run", "P", *ONE_GPU, "--run-id", "r1", "--max-retries", "0", "--", str(script), str(state))
    code, _, _ = cli(*args, "ckpt+exit3", "ckpt")
    assert code == 1
    code, out, err = cli(*args, "ckpt+exit3", "ckpt")  # a new supervisor, as a requeued job starts
    assert code == 0, err
    assert out.startswith("Relaunching r1")
    [run] = mlflow_server.runs()
    run_id = run["info"]["run_id"]
    assert identities(state) == [{"mlflow": run_id, "wandb": "r1"}] * 2
    resumed = [e for e in log_events(cli, "r1") if e["type"] == "resumed"]
    assert [e["mlflow_run_id"] for e in resumed] == [run_id]
    assert tags(run)["ftrain.state"] == "completed"


def test_a_tracker_that_never_answers_does_not_hold_training(
    cli: Cli, env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as silent:  # accepts connections (the backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{silent.getsockname()[1]}")
        monkeypatch.setenv("MLFLOW_RUN_ID", "given-by-the-user")
        script, state = tmp_path / "trainer.py", tmp_path / "trainer-state"
        script.write_text(TRAINER)
        state.mkdir()
        code, out, err = cli(
            "run", "P", *ONE_GPU, "--backoff", "0", "--", str(script), str(state), "ckpt+exit3", "ckpt"
        )
    assert code == 0, err
    assert out.splitlines()[-1].startswith(f"Completed {RUN}")
    assert log_events(cli, RUN)[0]["mlflow_run_id"] == "given-by-the-user"
    cursors = Cursors(cursor_path(Path(env["FTRAIN_HOME"])))
    assert cursors.delivered(RUN, "mlflow") == 0  # nothing taken: all of it still past the cursor, in the log
    cursors.close()


def test_a_run_launched_while_mlflow_was_down_gets_its_run_and_backlog_at_the_requeue(
    cli: Cli, mlflow_server: MlflowServer, tracked: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    script, state = tracked
    plain = script.with_name("plain.py")
    plain.write_text(TRAINER)  # the first attempt's script uses no tracker: it was down
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{closed.getsockname()[1]}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", down)
    args = ("run", "P", *ONE_GPU, "--run-id", "r1", "--max-retries", "0", "--")
    code, _, err = cli(*args, str(plain), str(state), "ckpt+exit3", "ckpt")
    assert code == 1
    assert "ftrain run: no MLflow run created, going on without one" in err
    assert log_events(cli, "r1")[0]["mlflow_run_id"] is None

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)  # back: the requeued job's supervisor
    code, _, err = cli(*args, str(script), str(state), "ckpt+exit3", "ckpt")
    assert code == 0, err
    [run] = mlflow_server.runs()
    run_id = run["info"]["run_id"]
    assert identities(state) == [{"mlflow": run_id, "wandb": "r1"}]
    assert [e["mlflow_run_id"] for e in log_events(cli, "r1") if e["type"] == "resumed"] == [run_id]
    # what the tracker missed while down came from the log: the first attempt's checkpoint and failure too
    assert [v for _, v in mlflow_server.metric(run_id, "ftrain.checkpoint_step")] == [10.0, 20.0]
    assert mlflow_server.metric(run_id, "ftrain.failure_step") == [(10, 10.0)]
    assert tags(run)["ftrain.state"] == "completed"
