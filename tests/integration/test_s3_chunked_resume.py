"""Manifest format 3 resumed from S3 (SeaweedFS and moto) in one process: the load reads each chunk of a data
file straight from the store, one ranged GET a chunk, and hands DCP its bytes only once it matched. A flip in
the last chunk of the last file, found after DCP parsed the items before it, refuses the checkpoint and the
resume falls back to the step before, everything half-loaded overwritten; a truncated object is refused before
any of its bytes is parsed; ranged GETs whose connections are cut stop the resume (storage unavailable), set
nothing aside, and a later start resumes from the same step (the file system's twin:
tests/integration/test_chunked_resume.py)."""

from pathlib import Path

import pytest
import torch

import ftrain.workers.dcp_writer
import ftrain.workers.storage.s3.dcp_stream
from ftrain.errors import ResumeStopped
from ftrain.workers.manifest import FORMAT, FileEntry, decode_manifest
from ftrain.workers.storage.s3.chunk_reads import RangedChunks
from ftrain.workers.verified_chunks import Segments, VerifiedChunks
from tests.integration.test_digests import outside_ftrain_run as outside_ftrain_run
from tests.integration.test_training_api import _train
from tests.support.cutting_proxy import cutting_proxy
from tests.support.s3 import Endpoint

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("outside_ftrain_run")]
CHUNK = 4096
"""Small chunks, so the trainer's few-KB shard has several."""
STEP10 = "ckpt/cut/step-10/"


@pytest.fixture
def bucket(s3: Endpoint, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket the trainer's AWS chain points at, saves chunked small."""
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    monkeypatch.setattr(ftrain.workers.dcp_writer, "DIGEST_CHUNK", CHUNK)
    monkeypatch.setattr(ftrain.workers.storage.s3.dcp_stream, "DIGEST_CHUNK", CHUNK)
    return s3.new_bucket()


def train(
    bucket: str, tmp_path: Path, steps: int, stop_at: int | None = None
) -> tuple[int, list[torch.Tensor], int]:
    return _train(f"s3://{bucket}/ckpt/cut", steps, stop_at, stage_dir=tmp_path / "work")


def spy_chunks(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, int, int]]:
    """Each item whose verified bytes the reader handed to DCP from the store: (step key, file, offset, length)."""
    handed: list[tuple[str, str, int, int]] = []
    real = VerifiedChunks.read

    def read(self: VerifiedChunks, name: str, offset: int, length: int) -> Segments:
        data = real(self, name, offset, length)
        assert isinstance(self._source, RangedChunks)
        handed.append((self._source.key_prefix, name, offset, length))
        return data

    monkeypatch.setattr(VerifiedChunks, "read", read)
    return handed


def saved_step_10(s3: Endpoint, bucket: str, tmp_path: Path) -> tuple[int, list[torch.Tensor], int]:
    """An uninterrupted run's outcome, after a run cut at step 10 saved steps 5 and 10 to the bucket in
    format 3, the last data file in several chunks."""
    whole = _train(tmp_path / "whole", 12)
    assert train(bucket, tmp_path, 12, stop_at=10)[0] == 10
    manifest = decode_manifest(
        s3.client().get_object(Bucket=bucket, Key=STEP10 + "manifest.json")["Body"].read()
    )
    assert manifest.format == FORMAT == 3
    last = data_file(manifest.files)
    assert last.chunk_size == CHUNK and len(last.chunks) > 2
    return whole


def data_file(files: tuple[FileEntry, ...]) -> FileEntry:
    return max((f for f in files if f.name.endswith(".distcp")), key=lambda f: f.name)


def set_aside(s3: Endpoint, bucket: str) -> list[str]:
    listed = s3.client().list_objects_v2(Bucket=bucket, Prefix="ckpt/cut/", Delimiter="/")
    return sorted(p["Prefix"] for p in listed.get("CommonPrefixes", ()) if ".corrupt-" in p["Prefix"])


def test_a_format_3_resume_reads_verified_chunks_from_the_store_bit_identical(
    s3: Endpoint, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = saved_step_10(s3, bucket, tmp_path)
    handed = spy_chunks(monkeypatch)
    step, weights, seen = train(bucket, tmp_path, 12)  # resumes from step 10
    assert (step, seen) == (12, 12)
    assert all(torch.equal(a, b) for a, b in zip(weights, whole[1], strict=True))
    assert {key for key, *_ in handed} == {STEP10}, "every item came from step 10's chunks in the store"
    assert set_aside(s3, bucket) == []


@pytest.mark.parametrize("algorithm", ["sha256", "blake3"])
def test_a_flip_in_the_last_chunk_of_the_last_file_falls_back_and_restores_everything(
    s3: Endpoint, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, algorithm: str
) -> None:
    monkeypatch.setenv("FTRAIN_DIGEST", algorithm)
    whole = saved_step_10(s3, bucket, tmp_path)
    client = s3.client()
    manifest = decode_manifest(client.get_object(Bucket=bucket, Key=STEP10 + "manifest.json")["Body"].read())
    last = data_file(manifest.files)
    assert last.algorithm == algorithm
    data = bytearray(client.get_object(Bucket=bucket, Key=STEP10 + last.name)["Body"].read())
    data[-1] ^= 0x01  # the last byte of the last chunk: every earlier chunk checks out
    client.put_object(Bucket=bucket, Key=STEP10 + last.name, Body=bytes(data))

    handed = spy_chunks(monkeypatch)
    step, weights, seen = train(bucket, tmp_path, 12)  # refuses step 10, resumes from step 5
    from_10 = [(name, offset, length) for key, name, offset, length in handed if key == STEP10]
    assert from_10, "DCP had parsed step 10's verified items before its last chunk failed"
    bad = (len(last.chunks) - 1) * CHUNK
    assert all(name != last.name or offset + length <= bad for name, offset, length in from_10), (
        "no byte of the bad chunk reached DCP"
    )
    assert (step, seen) == (12, 12)
    assert all(torch.equal(a, b) for a, b in zip(weights, whole[1], strict=True))
    assert len(set_aside(s3, bucket)) == 1, "step 10 set aside as corrupt, kept as evidence"


def test_a_truncated_object_is_refused_before_any_of_it_is_parsed(
    s3: Endpoint, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = saved_step_10(s3, bucket, tmp_path)
    client = s3.client()
    manifest = decode_manifest(client.get_object(Bucket=bucket, Key=STEP10 + "manifest.json")["Body"].read())
    last = data_file(manifest.files)
    data = client.get_object(Bucket=bucket, Key=STEP10 + last.name)["Body"].read()
    client.put_object(Bucket=bucket, Key=STEP10 + last.name, Body=data[: len(data) // 2])

    handed = spy_chunks(monkeypatch)
    step, weights, seen = train(bucket, tmp_path, 12)
    assert [h for h in handed if h[0] == STEP10] == [], "every ranged answer named the wrong size"
    assert (step, seen) == (12, 12)
    assert all(torch.equal(a, b) for a, b in zip(weights, whole[1], strict=True))
    assert len(set_aside(s3, bucket)) == 1


def test_ranged_gets_cut_by_the_network_stop_the_resume_and_set_nothing_aside(
    s3: Endpoint, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = saved_step_10(s3, bucket, tmp_path)
    with cutting_proxy(
        s3.url, rb"^GET [^ ]*\.distcp[^ ]* HTTP/1\.1\r\n(?:[^\r\n]*\r\n)*range: bytes="
    ) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        proxy.cutting.set()
        with pytest.raises(
            ResumeStopped, match=r"^storage unavailable: s3://[^ ]+/ckpt/cut/step-10/__0_0\.distcp: "
        ):
            train(bucket, tmp_path, 12)
        assert proxy.cut >= 2, "each ranged GET was retried, and cut again"
        proxy.cutting.clear()
        assert set_aside(s3, bucket) == [], "an unreachable store is never taken for a corrupt checkpoint"
        handed = spy_chunks(monkeypatch)
        step, weights, seen = train(bucket, tmp_path, 12)  # the network back: resumes from step 10
    assert {key for key, *_ in handed} == {STEP10}
    assert (step, seen) == (12, 12)
    assert all(torch.equal(a, b) for a, b in zip(weights, whole[1], strict=True))
