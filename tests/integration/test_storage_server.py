"""`ftrain storage start|stop|status`: the embedded SeaweedFS under $FTRAIN_HOME, private, reused, stopped."""

import json
import stat
from pathlib import Path

import pytest

from ftrain.cli.main import main
from ftrain.workers.s3.seaweed_server import DEFAULT_BUCKET, read_record, seaweed_dir
from ftrain.workers.storage.s3.boto_client import make_client
from tests.support.json_docs import documented


def _ftrain(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().out.splitlines()


def test_start_reuse_status_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FTRAIN_HOME", str(tmp_path / "home"))
    assert _ftrain(capsys, "storage", "status")[0] == 3
    code, out = _ftrain(capsys, "storage", "start")
    try:
        assert code == 0 and out[0].startswith("SeaweedFS S3 running at http://127.0.0.1:"), out
        assert "export AWS_PROFILE=ftrain-seaweedfs;" in out[1] and "FTRAIN_STORAGE=s3://ftrain/" in out[1]
        directory = seaweed_dir(tmp_path / "home")
        record = read_record(directory)
        assert record is not None and all(p < 55536 for p in record.ports)
        for name in ("keys", "s3.json", "server.json", "aws/config", "aws/credentials"):
            assert stat.S_IMODE((directory / name).stat().st_mode) == 0o600, name
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        assert record.secret_key not in "\n".join(out)  # the key stays in its 0600 files
        code, again = _ftrain(capsys, "storage", "start")
        assert code == 0 and again[0] == out[0]  # reused, not a second server
        client = make_client(
            endpoint=record.endpoint, access_key=record.access_key, secret_key=record.secret_key
        )
        assert DEFAULT_BUCKET in [b["Name"] for b in client.list_buckets()["Buckets"]]
        assert _ftrain(capsys, "storage", "status") == (0, out)
        code, doc = _ftrain(capsys, "storage", "status", "--json")
        assert code == 0 and set(json.loads(doc[0])) == documented()["ftrain storage status --json, running"]
    finally:
        code, stopped = _ftrain(capsys, "storage", "stop")
    assert (code, stopped) == (0, ["SeaweedFS stopped"])
    assert _ftrain(capsys, "storage", "status")[0] == 3
    assert _ftrain(capsys, "storage", "stop") == (0, ["SeaweedFS was not running"])
