"""The S3 backend's streamed save (`workers/storage/s3/dcp_stream.py`: each rank's items sent as multipart parts
from memory, hashed on the way, no local file) against real S3 servers, SeaweedFS and moto: a save through
DCP, sealed as every S3 save is, resumed after verification; a flipped byte found corrupt; a save killed or
cut off by a stopped store leaves nothing a resume trusts, and the partial-work cleanup removes what it left.
The trainer's streamed saves under torchrun: tests/e2e/test_s3_training.py."""

import logging
import os
import signal
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import pytest
import torch
from moto.server import ThreadedMotoServer
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from ftrain.workers.dcp_reader import RestrictedLoadPlanner, VerifiedReader, load_metadata, unchecked
from ftrain.workers.integrity import ALGORITHMS, DIGEST_CHUNK, digest_of
from ftrain.workers.manifest import FileEntry, Manifest
from ftrain.workers.storage.port import StoredCheckpoint
from ftrain.workers.storage.s3.part_upload import PART_SIZE, PartUpload
from ftrain.workers.storage.s3.run_prefix import S3Run
from ftrain.workers.storage.storage_errors import StorageUnavailable
from tests.support.processes import free_port
from tests.support.s3 import Endpoint

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]
RUN = "r1"
SHARD = "__0_0.distcp"


def state() -> dict[str, torch.Tensor]:
    """A state whose shard spans two parts and a bit (the last part short)."""
    return {"w": torch.arange((PART_SIZE * 2 + 4096) // 4, dtype=torch.float32), "step": torch.tensor(7)}


def streamed_save(run: S3Run, step: int, algorithm: str) -> StoredCheckpoint:
    """What a sync save of the trainer does on one rank: claim, DCP through the store's writer, seal."""
    uri = run.begin(step, 1)
    with run.rank_files(uri, step, 0, staged=False) as target:
        assert target.path is None, "a sync save streams: no local file"
        writer = run.dcp_writer(uri, target, algorithm)
        dcp_save(state(), storage_writer=writer)
        entries = writer.entries()
        run.deliver(uri, target, entries)
    manifest = Manifest(
        run_id=RUN,
        step=step,
        epoch=0,
        shards=1,
        world_size=1,
        dataset_revision=None,
        created_at=datetime.now(UTC),
        files=tuple(entries),
    )
    return run.seal(uri, manifest, 1)


def keys(s3: Endpoint, bucket: str) -> list[str]:
    return sorted(o["Key"] for o in s3.client().list_objects_v2(Bucket=bucket).get("Contents", ()))


def uploads(s3: Endpoint, bucket: str) -> list[str]:
    return [u["Key"] for u in s3.client().list_multipart_uploads(Bucket=bucket).get("Uploads", ())]


@pytest.fixture
def run(s3: Endpoint, tmp_path: Path) -> S3Run:
    found = s3.run(s3.new_bucket(), RUN)
    found.stage_dir = tmp_path / "stage"
    found.prepare(0, staged=False)
    return found


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_streamed_save_is_sealed_in_parts_and_a_verified_resume_loads_it(
    s3: Endpoint, run: S3Run, algorithm: str
) -> None:
    written = streamed_save(run, 10, algorithm)

    assert [(d.step, d.digest) for d in run.complete()] == [(10, written.checkpoint_hash)]
    files = {entry.name: entry for entry in written.manifest.files}
    assert set(files) == {".metadata", SHARD}, "the metadata's temporary name is gone"
    assert all(entry.algorithm == algorithm for entry in files.values())
    key = f"ckpt/{RUN}/step-10/{SHARD}"
    head = s3.client().head_object(Bucket=run.bucket.name, Key=key)
    assert head["ETag"].strip('"').endswith("-3"), "two full parts and a short last one"
    assert head["ContentLength"] == files[SHARD].size
    assert run.verify(written.uri, written.checkpoint_hash, run_id=RUN, step=10) is None

    manifest = run.read_manifest(written.uri, written.checkpoint_hash, run_id=RUN, step=10)
    assert isinstance(manifest, Manifest)
    loaded = {name: torch.zeros_like(tensor) for name, tensor in state().items()}
    with run.readable(written.uri, manifest, manifest.files, start="t", rank=0) as readable:
        assert readable.verdict is None
        metadata = load_metadata(readable.path, manifest.files)
        assert isinstance(metadata, Metadata), metadata  # parsed through the allowlist, as a resume does
        assert readable.left == {SHARD}, "its chunks are read from the store by the load, not downloaded"
        assert len(files[SHARD].chunks) == -(-files[SHARD].size // DIGEST_CHUNK), "format 3: chunk digests"
        shard = unchecked(manifest.files, manifest.files, readable.left, readable.source)
        reader = VerifiedReader(readable.path, metadata, readable.fetch, shard)
        dcp_load(loaded, storage_reader=reader, planner=RestrictedLoadPlanner())
    assert all(torch.equal(loaded[name], tensor) for name, tensor in state().items())


def test_a_flipped_byte_in_a_streamed_object_is_corrupt(s3: Endpoint, run: S3Run) -> None:
    written = streamed_save(run, 10, ALGORITHMS[-1])
    client, key = s3.client(), f"ckpt/{RUN}/step-10/{SHARD}"
    data = bytearray(client.get_object(Bucket=run.bucket.name, Key=key)["Body"].read())
    data[-1] ^= 0x01  # in the short last part
    client.put_object(Bucket=run.bucket.name, Key=key, Body=bytes(data))

    verdict = run.verify(written.uri, written.checkpoint_hash, run_id=RUN, step=10)
    assert verdict == f"file {SHARD} hash mismatch"


def test_a_save_killed_mid_stream_leaves_no_step_and_clean_aborts_its_upload(
    s3: Endpoint, run: S3Run
) -> None:
    """A real process claims step 10 and streams a part of its shard, then is SIGKILLed: no object of the
    shard exists (its multipart upload never completed), no step is listed, and the cleanup of partial work
    removes the claim and aborts the upload."""
    code = textwrap.dedent(f"""
        import sys
        from ftrain.workers.storage.s3.part_upload import PART_SIZE
        from ftrain.workers.storage.s3.run_prefix import S3Run
        from ftrain.workers.storage.location import run_location
        run = S3Run(run_location("s3://{run.bucket.name}/ckpt/{RUN}"))
        uri = run.begin(10, 1)
        with run.rank_files(uri, 10, 0, staged=False) as target:
            writer = run.dcp_writer(uri, target, "sha256")
            with writer.fs.create_stream(writer.fs.concat_path(writer.path, "{SHARD}"), "wb") as stream:
                stream.write(bytes(PART_SIZE + 1))
                print("streaming", flush=True)
                sys.stdin.read()
    """)
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=os.environ | s3.env()
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"streaming\n"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()

    assert keys(s3, run.bucket.name) == [f"ckpt/{RUN}/step-10/.writer"], "no torn object"
    assert uploads(s3, run.bucket.name) == [f"ckpt/{RUN}/step-10/{SHARD}"]
    assert run.complete() == []
    assert len(run.clean()) == 2, "the claimed step and its upload"
    assert keys(s3, run.bucket.name) == [] and uploads(s3, run.bucket.name) == []
    assert streamed_save(run, 10, ALGORITHMS[0]).manifest.step == 10, "the step saves again"


def finish_or_abort(upload: PartUpload, rest: bytes) -> None:
    """The rest written and the upload finished, or, on failure, aborted, as the stream does."""
    try:
        upload.write(memoryview(rest))
        upload.finish()
    except StorageUnavailable:
        upload.abort()  # the store cannot be told: the cleanup will
        raise


def test_a_store_stopped_mid_stream_is_unavailable_and_nothing_is_sealed(tmp_path: Path) -> None:
    """The store goes away while parts are in flight: the write fails as storage unavailable (never a
    verdict on a checkpoint), the object never appears, and once the store is back no step is listed."""
    port = free_port()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    store = Endpoint("moto", f"http://127.0.0.1:{port}", "testing", "testing", False)
    bucket = store.new_bucket()
    run = store.run(bucket, RUN, timeout=2)
    uri = run.begin(10, 1)
    upload = PartUpload(run.bucket, f"ckpt/{RUN}/step-10/{SHARD}")
    upload.write(memoryview(bytes(PART_SIZE)))
    server.stop()
    with pytest.raises(StorageUnavailable, match="storage unavailable"):
        finish_or_abort(upload, bytes(PART_SIZE))
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        assert keys(store, bucket) == [f"ckpt/{RUN}/step-10/.writer"]
        assert run.complete() == [] and run.verify(uri, "0" * 64) == "completion marker missing"
    finally:
        server.stop()


def test_entries_name_what_the_stream_hashed(s3: Endpoint, run: S3Run) -> None:
    """An object smaller than a part goes up in one put, its digest the stream's."""
    uri = run.begin(10, 1)
    with run.rank_files(uri, 10, 0, staged=False) as target:
        writer = run.dcp_writer(uri, target, ALGORITHMS[0])
        with writer.fs.create_stream(writer.fs.concat_path(writer.path, "small"), "wb") as stream:
            stream.write(b"abc")
            assert stream.tell() == 3
    hashed = run.bucket.hashed(f"ckpt/{RUN}/step-10/small")
    chunk = digest_of(b"abc").removeprefix("sha256:")
    assert hashed is not None
    assert writer.entries() == [FileEntry("small", 3, hashed.digest, DIGEST_CHUNK, (chunk,))]
