"""The tracker identity every attempt gets, the MLflow run the fold keeps across relaunches, and what the log
says to a tracker: pure. Against a real MLflow server and W&B offline: tests/e2e/test_trackers.py."""

from datetime import timedelta

import msgspec

from ftrain.domain.vouching import Vouched
from ftrain.events.schema import Failed, Resumed
from ftrain.service.run_queries import RunView
from ftrain.trackers.identity import WANDB_ID_MAX, tracker_env, wandb_run_id
from ftrain.trackers.lifecycle import run_tags, writes
from tests.support.builders import T0, checkpointed, fold, launched


def stamped(*events: object) -> list:  # type: ignore[type-arg]
    return [
        msgspec.structs.replace(e, seq=n, time=T0 + timedelta(minutes=n)) for n, e in enumerate(events, 1)
    ]


def test_the_wandb_id_is_the_run_id_or_a_digest_of_a_long_one() -> None:
    assert wandb_run_id("dist-P-1x1-fsdp") == "dist-P-1x1-fsdp"
    long_a, long_b = "a" * 100, "a" * 99 + "b"
    assert len(wandb_run_id(long_a)) == WANDB_ID_MAX
    assert wandb_run_id(long_a) != wandb_run_id(long_b)
    assert wandb_run_id(long_a) == wandb_run_id(long_a)


def test_every_attempt_gets_one_identity_and_a_users_wandb_id_is_kept() -> None:
    assert tracker_env({}, "r1", None) == {"WANDB_RUN_ID": "r1", "WANDB_RESUME": "allow"}
    assert tracker_env({"WANDB_RUN_ID": "mine"}, "r1", "abc") == {
        "WANDB_RUN_ID": "mine",
        "WANDB_RESUME": "allow",
        "MLFLOW_RUN_ID": "abc",
    }


def test_the_mlflow_run_is_the_launchs_until_a_relaunch_names_another() -> None:
    launch = msgspec.structs.replace(launched("r1"), mlflow_run_id="m1")
    failed = Failed(run_id="r1", reason="oom")
    resumed = Resumed(
        run_id="r1", checkpoint_seq=0, step=0, epoch=0, uri="", checkpoint_hash="", resume_count=1
    )
    assert fold(launch, failed, resumed).mlflow_run_id == "m1"  # an old log's `resumed` names none
    named = msgspec.structs.replace(resumed, mlflow_run_id="m2")
    assert fold(launched("r1"), failed, named).mlflow_run_id == "m2"
    again = msgspec.structs.replace(resumed, resume_count=2)
    assert fold(launched("r1"), failed, named, failed, again).mlflow_run_id == "m2"


def test_old_resumed_payloads_still_decode_without_the_field() -> None:
    old = b'{"type":"resumed","run_id":"r1","checkpoint_seq":0,"step":0,"epoch":0,"uri":"","checkpoint_hash":"","resume_count":1}'
    event = msgspec.json.decode(old, type=Resumed)
    assert event.mlflow_run_id is msgspec.UNSET
    assert b"mlflow_run_id" not in msgspec.json.encode(event)


def test_tags_say_the_judged_state_signer_and_newest_valid_checkpoint() -> None:
    state = fold(launched("r1"), checkpointed("r1", 10))
    tags = run_tags(RunView("r1", state, vouched=Vouched("alice@h")))
    assert tags == {
        "ftrain.run_id": "r1",
        "ftrain.state": "running",
        "ftrain.attempt": "1",
        "ftrain.signer": "alice@h",
        "ftrain.checkpoint_uri": "file:///tmp/absent-step-10",
        "ftrain.checkpoint_hash": f"{10:064x}",
    }
    assert run_tags(RunView("r2", None))["ftrain.state"] == "broken"


def test_writes_carry_each_events_step_and_metrics_past_the_cursor_only() -> None:
    events = stamped(
        launched("r1"),
        msgspec.structs.replace(checkpointed("r1", 10), stall_seconds=0.5, train_seconds=30.0, attempt=1),
        Failed(run_id="r1", reason="oom", attempt=1),
        Resumed(
            run_id="r1",
            checkpoint_seq=2,
            step=10,
            epoch=1,
            uri="u",
            checkpoint_hash="h",
            resume_count=1,
            attempt=2,
        ),
    )
    out = writes(events, {"ftrain.run_id": "r1"}, after=0, limit=10)
    assert [(w.seq, w.step) for w in out] == [(1, 0), (2, 10), (3, 10), (4, 10)]
    assert out[1].metrics["ftrain.checkpoint_step"] == 10 and out[1].metrics["ftrain.stall_seconds"] == 0.5
    assert out[2].metrics["ftrain.failure_step"] == 10
    assert out[3].metrics["ftrain.resume_step"] == 10 and out[3].metrics["ftrain.attempt"] == 2
    assert 0 < out[1].metrics["ftrain.goodput"] <= 1  # 30 s trained of the minute since the launch
    assert all(w.tags == {"ftrain.run_id": "r1"} for w in out)
    assert [w.seq for w in writes(events, {}, after=2, limit=10)] == [3, 4]
    assert [w.seq for w in writes(events, {}, after=0, limit=2)] == [1, 2]
