"""The control-plane scenario against `s3://` storage on a real SeaweedFS, through the CLI in this process:
launch, checkpoints uploaded, a failure, a corrupted newest checkpoint skipped and quarantined, resume from the
older one, status showing `s3://` URIs, an intact audit. Also: async saves to S3 refused, an unreachable endpoint."""

import re
from pathlib import Path

import pytest

from tests.support.builders import SIGNER
from tests.support.cli import RUN, Cli, checkpoint, ckpt_args, launch
from tests.support.s3 import Endpoint


@pytest.fixture
def s3_cli(
    capsys: pytest.CaptureFixture[str], env: dict[str, str], weed: Endpoint, monkeypatch: pytest.MonkeyPatch
) -> tuple[Cli, str]:
    bucket = weed.new_bucket()
    root = f"s3://{bucket}/ckpt"
    for key, value in {**weed.env(), "FTRAIN_STORAGE": root}.items():
        monkeypatch.setenv(key, value)
        env[key] = value
    for key in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(key, raising=False)
    return Cli(capsys, env), bucket


def test_the_control_plane_scenario_on_s3(s3_cli: tuple[Cli, str], weed: Endpoint, tmp_path: Path) -> None:
    cli, bucket = s3_cli
    root = f"s3://{bucket}/ckpt"
    launch(cli, "--dataset-revision", "A1-rev")
    [line] = checkpoint(cli, 500, 2)
    assert re.fullmatch(
        rf"Checkpoint step 500 epoch 2 → {root}/{RUN}/step-500 \(hash [0-9a-f]{{4}}…, 8 shard\(s\)\)", line
    )
    shards = tmp_path / "dcp"
    shards.mkdir()
    for rank in range(8):
        (shards / f"__{rank}_0.distcp").write_bytes(bytes([rank]) * 1000)
    (shards / ".metadata").write_bytes(b"meta")
    cli.ok(*ckpt_args("1000", "5", "8", "--path", str(shards)))
    cli.ok("fail", RUN, "--reason", "preempted")
    client = weed.client()
    key = f"ckpt/{RUN}/step-1000/__3_0.distcp"
    data = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[500] ^= 0x01
    client.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    out = cli.ok("resume", RUN)
    assert out[0] == "checkpoint step 1000 file __3_0.distcp hash mismatch → skipped"
    assert (
        out[1] == f"Resuming {RUN} from step 500 epoch 2 ({root}/{RUN}/step-500) — optimizer state preserved."
    )
    listed = client.list_objects_v2(Bucket=bucket, Prefix=f"ckpt/{RUN}/", Delimiter="/")
    names = sorted(p["Prefix"].split("/")[-2] for p in listed.get("CommonPrefixes", []))
    assert "step-1000.corrupt-5" in names  # quarantined: copied aside, the step's name freed
    assert not client.list_objects_v2(Bucket=bucket, Prefix=f"ckpt/{RUN}/step-1000/").get("Contents")
    checkpoint(cli, 1000, 5)  # re-trained into the freed name
    status = cli.ok("status", RUN)
    assert any(f"{root}/{RUN}/step-1000" in line for line in status), status
    assert cli.ok("audit", "verify") == [
        f"Verified 7 event(s) in 1 run(s): every chain intact and anchored; signed by {SIGNER} (1 run(s))"
    ]
    kinds = [line.split()[5] for line in cli.ok("replay", RUN)]
    assert kinds == ["launched", "checkpointed", "checkpointed", "failed", "corrupt_skipped", "resumed",
                     "checkpointed"]  # fmt: skip


def test_a_step_sealed_on_s3_is_refused_a_second_time(s3_cli: tuple[Cli, str]) -> None:
    cli, _ = s3_cli
    launch(cli)
    checkpoint(cli, 500, 2)
    before = cli.last_seq()
    code, _, err = cli(*ckpt_args("500", "2", "8", "--state", "{}"))
    assert code == 1 and err.count("\n") == 1, err
    assert cli.last_seq() == before


def test_an_unreachable_endpoint_records_nothing(
    s3_cli: tuple[Cli, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cli, _ = s3_cli
    launch(cli)
    checkpoint(cli, 500, 2)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    before = cli.last_seq()
    code, _, err = cli(*ckpt_args("1000", "5", "8", "--state", "{}"))
    assert code == 1 and "storage unavailable" in err and err.count("\n") == 1, err
    assert cli.last_seq() == before
    cli.ok("fail", RUN)
    before = cli.last_seq()
    code, _, err = cli("resume", RUN)
    assert code == 1 and "storage unavailable" in err and "nothing recorded" in err, err
    assert cli.last_seq() == before


def test_a_missing_bucket_is_one_line_naming_the_servers_reason(
    s3_cli: tuple[Cli, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cli, _ = s3_cli
    monkeypatch.setenv("FTRAIN_STORAGE", "s3://no-such-bucket-x/ckpt")
    launch(cli)
    before = cli.last_seq()
    code, _, err = cli(*ckpt_args("500", "2", "8", "--state", "{}"))
    assert (code, err.count("\n")) == (1, 1) and "NoSuchBucket" in err, err
    assert cli.last_seq() == before
