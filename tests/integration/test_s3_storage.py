"""The S3 backend of the storage port against two real S3 implementations, SeaweedFS and moto: the same suite
on both, so nothing depends on one store's quirks. No mocks: every call goes over HTTP to a real server."""

import threading
import time
from pathlib import Path

import msgspec
import pytest

from ftrain.workers.integrity import Hashed, hash_file
from ftrain.workers.layout import MARKER, WRITER_CLAIM
from ftrain.workers.storage.s3 import step_objects
from ftrain.workers.storage.s3.partial import Claim
from ftrain.workers.storage.s3.run_prefix import S3Run
from ftrain.workers.storage.storage_errors import CheckpointExists, StorageError, StorageUnavailable
from tests.support.s3 import S3_KINDS, Endpoint, endpoint, write_whole

KINDS = list(S3_KINDS)


@pytest.fixture
def bucket(s3: Endpoint) -> str:
    return s3.new_bucket()


@pytest.fixture
def run(s3: Endpoint, bucket: str) -> S3Run:
    return s3.run(bucket, "r1")


def _write(run: S3Run, step: int, sources: list[tuple[str, bytes | Path]] | None = None) -> str:
    written = write_whole(
        run,
        step=step,
        epoch=step // 10,
        shards=1,
        sources=sources or [("state.json", f'{{"step":{step}}}'.encode())],
    )
    return written.uri


def _objects(s3: Endpoint, bucket: str, prefix: str = "") -> list[str]:
    found = s3.client().list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return sorted(o["Key"] for o in found)


def test_write_seal_list_verify_delete_round_trip(
    s3: Endpoint, bucket: str, run: S3Run, tmp_path: Path
) -> None:
    big = tmp_path / "__0_0.distcp"
    big.write_bytes(bytes(range(256)) * (66 << 12))  # 66 MiB + : over the multipart threshold
    written = write_whole(
        run,
        step=10,
        epoch=1,
        shards=1,
        sources=[("state.json", b"{}"), ("__0_0.distcp", big)],
    )
    assert written.uri == f"s3://{bucket}/ckpt/r1/step-10"
    assert run.location.root == f"s3://{bucket}/ckpt"
    assert _objects(s3, bucket) == [
        "ckpt/r1/step-10/.complete",
        "ckpt/r1/step-10/.writer",  # the claim stays: a late writer of step 10 is refused at its claim
        "ckpt/r1/step-10/__0_0.distcp",
        "ckpt/r1/step-10/manifest.json",
        "ckpt/r1/step-10/state.json",
    ]
    entry = next(f for f in written.manifest.files if f.name == "__0_0.distcp")
    assert entry.size == big.stat().st_size
    listed = run.complete()
    assert [(d.step, d.uri, d.digest) for d in listed] == [(10, written.uri, written.checkpoint_hash)]
    assert run.verify(written.uri, written.checkpoint_hash, run_id="r1", step=10) is None
    assert run.verify(written.uri, "0" * 64) == "hash mismatch"
    assert run.verify(written.uri, written.checkpoint_hash, run_id="r1", step=20) is not None
    run.discard(written.uri)
    assert _objects(s3, bucket) == []
    assert run.complete() == []


def test_a_sealed_step_is_never_overwritten(run: S3Run) -> None:
    uri = _write(run, 10)
    with pytest.raises(CheckpointExists):
        _write(run, 10)
    assert len(run.complete()) == 1
    assert run.verify(uri, run.complete()[0].digest) is None


def test_two_writers_of_one_step_exactly_one_wins(s3: Endpoint, bucket: str) -> None:
    outcomes: list[str] = []
    barrier = threading.Barrier(2)

    def writer(n: int) -> None:
        run = s3.run(bucket, "r1")
        barrier.wait()
        try:
            _write(run, 30, [("state.json", f'{{"writer":{n}}}'.encode())])
            outcomes.append("sealed")
        except CheckpointExists:
            outcomes.append("refused")

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["refused", "sealed"]
    run = s3.run(bucket, "r1")
    (only,) = run.complete()
    assert run.verify(only.uri, only.digest, run_id="r1", step=30) is None


def test_the_marker_is_one_conditional_put(s3: Endpoint, bucket: str, run: S3Run) -> None:
    """The seal itself: a second `If-None-Match: *` put of the marker is refused (412) on both stores."""
    assert run.bucket.put_if_absent("ckpt/r1/step-5/.complete", b"first")
    assert not run.bucket.put_if_absent("ckpt/r1/step-5/.complete", b"second")
    body = s3.client().get_object(Bucket=bucket, Key="ckpt/r1/step-5/.complete")["Body"].read()
    assert body == b"first"


def test_damage_is_a_verdict_never_an_error(s3: Endpoint, bucket: str, run: S3Run) -> None:
    client = s3.client()
    flipped, deleted, unmarked, gone_manifest = (_write(run, s) for s in (10, 20, 30, 40))
    digests = {d.step: d.digest for d in run.complete()}
    key = "ckpt/r1/step-10/state.json"
    data = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[3] ^= 0x01
    client.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    client.delete_object(Bucket=bucket, Key="ckpt/r1/step-20/state.json")
    client.delete_object(Bucket=bucket, Key="ckpt/r1/step-30/.complete")
    client.delete_object(Bucket=bucket, Key="ckpt/r1/step-40/manifest.json")
    assert run.verify(flipped, digests[10]) == "file state.json hash mismatch"
    assert run.verify(deleted, digests[20]) == "file state.json missing"
    assert run.verify(unmarked, digests[30]) == "completion marker missing"
    assert run.verify(gone_manifest, digests[40]) == "manifest missing"
    assert run.verify(f"s3://{bucket}/ckpt/r1/step-99", digests[10]) == "directory missing"
    assert [d.step for d in run.complete()] == [40, 20, 10]  # an unmarked step is not complete


def test_cleanup_removes_unmarked_steps_and_stale_uploads_but_not_a_live_writers(
    s3: Endpoint, bucket: str, run: S3Run
) -> None:
    client = s3.client()
    sealed = _write(run, 10)
    client.put_object(Bucket=bucket, Key="ckpt/r1/step-20/state.json", Body=b"half")  # a dead writer's
    dead = Claim("ignored-host", 1, "n", time.time())
    client.put_object(Bucket=bucket, Key=f"ckpt/r1/step-30/{WRITER_CLAIM}", Body=msgspec.json.encode(dead))
    live = msgspec.json.encode(Claim(__import__("socket").gethostname(), __import__("os").getpid(), "n", 0.0))
    client.put_object(Bucket=bucket, Key=f"ckpt/r1/step-40/{WRITER_CLAIM}", Body=live)
    client.put_object(Bucket=bucket, Key="ckpt/r1/step-40/state.json", Body=b"in flight")
    stale_upload = client.create_multipart_upload(Bucket=bucket, Key="ckpt/r1/step-50/__0_0.distcp")
    removed = run.clean()
    assert f"s3://{bucket}/ckpt/r1/step-20" in removed
    assert any(stale_upload["UploadId"] in r for r in removed)
    keys = _objects(s3, bucket)
    assert not any(k.startswith("ckpt/r1/step-20/") for k in keys)
    assert "ckpt/r1/step-40/state.json" in keys  # a live writer of this host keeps its work
    assert f"ckpt/r1/step-30/{WRITER_CLAIM}" in keys  # another host's writer is left alone
    assert not client.list_multipart_uploads(Bucket=bucket, Prefix="ckpt/r1/").get("Uploads")
    assert run.verify(sealed, run.complete()[0].digest) is None


def test_quarantine_copies_aside_and_frees_the_step(s3: Endpoint, bucket: str, run: S3Run) -> None:
    uri = _write(run, 10)
    digest = run.complete()[0].digest
    moved = run.quarantine(uri, "corrupt", "7")
    assert moved == f"s3://{bucket}/ckpt/r1/step-10.corrupt-7"
    assert run.complete() == []
    assert run.verify(moved, digest) is None  # the evidence is whole
    assert _write(run, 10) == uri  # the step's name is free for the re-trained checkpoint
    assert run.quarantine(f"s3://{bucket}/ckpt/r1/step-99", "corrupt", "8") is None


def test_confinement_accepts_only_the_runs_own_steps(bucket: str, run: S3Run) -> None:
    own = f"s3://{bucket}/ckpt/r1/step-10"
    assert run.confined(own) == own
    for uri in (
        f"s3://{bucket}/ckpt/r2/step-10",
        f"s3://{bucket}/ckpt/r1/step-10/x",
        f"s3://{bucket}/ckpt/r1/",
        f"s3://{bucket}/other/r1/step-10",
        "s3://another-bucket/ckpt/r1/step-10",
        f"s3://{bucket}/ckpt/r1/..",
        "file:///ckpt/r1/step-10",
    ):
        assert run.confined(uri) is None, uri


def test_a_missing_bucket_is_unavailable_naming_the_servers_reason(s3: Endpoint) -> None:
    run = s3.run("no-such-bucket-here", "r1")
    with pytest.raises(StorageUnavailable, match=r"NoSuchBucket") as raised:
        run.complete()
    assert "\n" not in str(raised.value)
    with pytest.raises(StorageUnavailable, match=r"NoSuchBucket"):
        run.verify("s3://no-such-bucket-here/ckpt/r1/step-10", "0" * 64)
    with pytest.raises(StorageUnavailable, match=r"NoSuchBucket"):
        _write(run, 10)


def test_wrong_credentials_are_unavailable_naming_the_servers_reason(s3: Endpoint, bucket: str) -> None:
    if not s3.checks_credentials:
        pytest.skip("moto admits any keys")
    run = s3.run(bucket, "r1", secret_key="not-the-secret")
    with pytest.raises(StorageUnavailable, match=r"SignatureDoesNotMatch") as raised:
        run.complete()
    assert "\n" not in str(raised.value)
    with pytest.raises(StorageUnavailable, match=r"SignatureDoesNotMatch"):
        _write(run, 10)


@pytest.mark.parametrize("kind", KINDS)
def test_a_stopped_endpoint_is_unavailable_within_the_bound(kind: str, tmp_path: Path) -> None:
    with endpoint(kind, tmp_path) as s3:
        bucket = s3.new_bucket()
        run = s3.run(bucket, "r1", timeout=2.0)
        uri = _write(run, 10)
        digest = run.complete()[0].digest
    started = time.monotonic()
    with pytest.raises(StorageUnavailable, match="storage unavailable"):
        run.verify(uri, digest)
    with pytest.raises(StorageUnavailable):
        run.complete()
    with pytest.raises(StorageUnavailable):
        _write(run, 20)
    assert time.monotonic() - started < 30


def test_checksums_go_on_the_wire_and_both_stores_keep_them(
    s3: Endpoint, bucket: str, run: S3Run, tmp_path: Path
) -> None:
    """boto3's default CRC32 travels with every upload, single-part and multipart (checked by the store on
    arrival); both stores accept and keep it."""
    big = tmp_path / "__0_0.distcp"
    big.write_bytes(bytes(range(256)) * (66 << 12))  # multipart
    uri = write_whole(
        run,
        step=10,
        epoch=1,
        shards=1,
        sources=[("state.json", b"{}"), ("__0_0.distcp", big)],
    ).uri
    client = s3.client()
    for name in ("state.json", "__0_0.distcp", "manifest.json", MARKER):
        head = client.head_object(Bucket=bucket, Key=f"ckpt/r1/step-10/{name}", ChecksumMode="ENABLED")
        assert head.get("ChecksumCRC32"), name
    run.discard(uri)
    assert _objects(s3, bucket) == []


def test_the_standard_switch_turns_wire_checksums_off(
    s3: Endpoint, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For a store that refuses the checksum headers: AWS_REQUEST_CHECKSUM_CALCULATION=when_required (the AWS
    chain's own setting) sends none, and a save and a delete (DeleteObjects requires one) still go through."""
    monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required")
    run = s3.run(bucket, "r1")
    assert run.bucket.client.meta.config.request_checksum_calculation == "when_required"
    uri = _write(run, 10)
    head = s3.client().head_object(Bucket=bucket, Key="ckpt/r1/step-10/state.json", ChecksumMode="ENABLED")
    assert not head.get("ChecksumCRC32")
    run.discard(uri)
    assert _objects(s3, bucket) == []


def test_marker_key_is_the_layouts(run: S3Run, s3: Endpoint, bucket: str) -> None:
    _write(run, 10)
    assert f"ckpt/r1/step-10/{MARKER}" in _objects(s3, bucket)


def test_an_upload_with_its_digest_known_is_sent_whole_and_its_stored_size_checked(
    s3: Endpoint, bucket: str, run: S3Run, tmp_path: Path
) -> None:
    """The trainer's upload: the digest computed while DCP wrote the file travels with it (the file is not
    hashed again); a stored object of another size than the writer's fails the upload, a kept one matches."""
    shard = tmp_path / "__0_0.distcp"
    shard.write_bytes(bytes(range(256)) * (66 << 12))  # multipart
    known = hash_file(shard)
    uri = run.begin(10, None)
    entry = step_objects.upload(run.bucket, uri, "__0_0.distcp", shard, known)  # as `S3Run.deliver` does
    assert (entry.size, entry.digest) == (known.size, known.digest)
    assert run.bucket.hashed("ckpt/r1/step-10/__0_0.distcp") == known
    (tmp_path / "small").write_bytes(b"x" * 16896)
    with pytest.raises(StorageError, match="stored 16896 bytes, sent 16897"):
        step_objects.upload(run.bucket, uri, "small", tmp_path / "small", Hashed(16897, known.digest))
