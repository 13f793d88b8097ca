"""Format 3's chunk digests, on real files: the writer's one pass gives each chunk's digest beside the file's,
and a reader hands out only bytes of chunks it verified (the same bytes it hashed, never read again), fails
at the first bad chunk it is asked for, and, for the files it answers for, at a bad chunk nobody asked for."""

import os
from pathlib import Path

import msgspec
import pytest
import torch
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from ftrain.workers.dcp_writer import HashingWriter
from ftrain.workers.integrity import Hasher, hash_fd, hash_file, hex_of
from ftrain.workers.manifest import FORMAT, FileEntry, decode_manifest, entry_of
from ftrain.workers.storage.file.page_cache import cached
from ftrain.workers.storage.verdict import chunks_verdict
from ftrain.workers.verified_chunks import LocalChunks, Rejected, VerifiedChunks
from tests.support.page_cache import evict

SIZE = 64
"""The chunk size of these tests: files of a few chunks, the last one short."""


def entry(path: Path, algorithm: str = "sha256") -> FileEntry:
    return entry_of(path.name, hash_file(path, algorithm, SIZE))


def flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "__0_0.distcp"
    path.write_bytes(os.urandom(SIZE * 3 + 10))
    return path


@pytest.mark.parametrize("algorithm", ["sha256", "blake3"])
def test_one_pass_gives_each_chunks_digest_beside_the_files_whatever_the_writes_sizes(
    data: Path, algorithm: str
) -> None:
    raw = data.read_bytes()
    hasher = Hasher(algorithm, SIZE)
    for start, end in ((0, 5), (5, 64), (64, 200), (200, len(raw))):
        hasher.update(raw[start:end])
    hashed = hasher.result()
    assert hashed == hash_file(data, algorithm, SIZE)
    with data.open("rb") as f:
        assert hash_fd(f.fileno(), algorithm, SIZE) == hashed, "chunks hashed beside the file's digest"
    assert hashed.digest == hash_file(data, algorithm).digest, "the root is the whole file's digest"
    assert hashed.chunks == tuple(hex_of(raw[i : i + SIZE], algorithm) for i in range(0, len(raw), SIZE))
    assert len(hashed.chunks) == 4 and hashed.chunk_size == SIZE


def test_a_format_3_entry_round_trips_and_one_without_chunks_encodes_as_format_2_did(data: Path) -> None:
    chunked = entry(data)
    assert msgspec.json.decode(msgspec.json.encode(chunked), type=FileEntry) == chunked
    whole = FileEntry("state.json", 2, chunked.digest)
    assert (
        msgspec.json.encode(whole) == b'{"name":"state.json","size":2,"digest":"%s"}' % whole.digest.encode()
    )
    assert not whole.chunked and chunks_verdict(whole) is None
    assert FORMAT == 3


def test_chunk_digests_that_cannot_cover_the_file_are_refused(data: Path) -> None:
    good = entry(data)
    assert chunks_verdict(good) is None
    short = msgspec.structs.replace(good, chunks=good.chunks[:-1])
    assert chunks_verdict(short) == f"file {data.name} lists 3 chunk digests for {good.size} bytes"
    sizeless = msgspec.structs.replace(good, chunk_size=0)
    assert chunks_verdict(sizeless) == f"file {data.name} lists chunk digests of 0 bytes"


def test_a_format_2_manifest_decodes_with_no_chunks(tmp_path: Path) -> None:
    raw = (
        b'{"format":2,"run_id":"r","step":5,"epoch":0,"shards":1,"world_size":1,"dataset_revision":null,'
        b'"created_at":"2026-01-01T00:00:00Z","files":[{"name":"a","size":1,"digest":"sha256:'
        + b"0" * 64
        + b'"}]}'
    )
    assert [(f.chunk_size, f.chunks, f.chunked) for f in decode_manifest(raw).files] == [(0, (), False)]


def test_reads_across_chunk_boundaries_get_the_files_bytes_and_a_clean_file_finishes(data: Path) -> None:
    raw, e = data.read_bytes(), entry(data)
    reads = [(e.name, 0, 10), (e.name, 60, 80), (e.name, 150, e.size - 150)]
    with VerifiedChunks(LocalChunks(data.parent), {e.name: e}, reads, complete={e.name}) as chunks:
        assert [chunks.read(*r).read() for r in reads] == [raw[o : o + n] for _, o, n in reads]
        chunks.finish()


def test_bytes_handed_out_are_the_bytes_verified_not_a_second_read(data: Path) -> None:
    raw, e = data.read_bytes(), entry(data)
    reads = [(e.name, 0, 8), (e.name, 8, 8)]  # both in chunk 1: it is kept for the second read
    with VerifiedChunks(LocalChunks(data.parent), {e.name: e}, reads, complete=()) as chunks:
        assert chunks.read(*reads[0]).read() == raw[:8]
        flip(data, 10)  # the disk changes under the load, after the chunk was checked
        assert chunks.read(*reads[1]).read() == raw[8:16]
        chunks.finish()


def test_a_bad_last_chunk_fails_its_read_after_the_earlier_chunks_were_handed_out(data: Path) -> None:
    raw, e = data.read_bytes(), entry(data)
    flip(data, e.size - 1)
    reads = [(e.name, 0, SIZE * 3), (e.name, SIZE * 3, 10)]
    with VerifiedChunks(LocalChunks(data.parent), {e.name: e}, reads, complete={e.name}) as chunks:
        assert chunks.read(*reads[0]).read() == raw[: SIZE * 3]
        with pytest.raises(Rejected, match=r"^file __0_0\.distcp hash mismatch$"):
            chunks.read(*reads[1])


def test_a_bad_chunk_nobody_reads_fails_the_rank_that_answers_for_its_file_only(data: Path) -> None:
    e = entry(data)
    flip(data, SIZE * 2 + 1)
    reads = [(e.name, 0, 10)]
    with VerifiedChunks(LocalChunks(data.parent), {e.name: e}, reads, complete=()) as chunks:
        chunks.read(*reads[0])
        chunks.finish()  # another rank answers for this file
    with VerifiedChunks(LocalChunks(data.parent), {e.name: e}, reads, complete={e.name}) as chunks:
        chunks.read(*reads[0])
        with pytest.raises(Rejected, match=r"^file __0_0\.distcp hash mismatch$"):
            chunks.finish()


def test_a_file_of_another_size_or_missing_is_refused_before_any_read(data: Path) -> None:
    e = entry(data)
    with data.open("ab") as f:
        f.write(b"x")
    with pytest.raises(
        Rejected, match=rf"^file __0_0\.distcp is {e.size + 1} bytes, manifest says {e.size}$"
    ):
        VerifiedChunks(LocalChunks(data.parent), {e.name: e}, [], complete={e.name}).__enter__()
    data.unlink()
    with pytest.raises(Rejected, match=r"^file __0_0\.distcp missing$"):
        VerifiedChunks(LocalChunks(data.parent), {e.name: e}, [], complete={e.name}).__enter__()


def test_a_read_is_a_seekable_stream_over_the_chunks_it_spans(data: Path) -> None:
    raw, e = data.read_bytes(), entry(data)
    reads = [(e.name, 50, 100)]  # chunks 1 and 2
    with VerifiedChunks(LocalChunks(data.parent), {e.name: e}, reads, complete=()) as chunks:
        stream = chunks.read(*reads[0])
        assert stream.seek(-30, os.SEEK_END) == 70 and stream.read(20) == raw[120:140]
        stream.seek(10)
        buffer = bytearray(40)
        assert stream.readinto(buffer) == 40 and bytes(buffer) == raw[60:100]
        assert stream.tell() == 50 and stream.read() == raw[100:150] and stream.read(5) == b""
        chunks.finish()


def test_a_read_closes_the_stream_before_it_so_a_reused_buffer_is_never_seen(data: Path) -> None:
    raw, e = data.read_bytes(), entry(data)
    reads = [(e.name, 0, 8), (e.name, SIZE, 8), (e.name, SIZE * 2, 8)]
    with VerifiedChunks(LocalChunks(data.parent), {e.name: e}, reads, complete=()) as chunks:
        first = chunks.read(*reads[0])
        second = chunks.read(*reads[1])  # chunk 1 is wanted no more: its buffer may hold chunk 3 next
        with pytest.raises(ValueError, match="closed"):
            first.read()
        assert second.read() == raw[SIZE : SIZE + 8]
        assert chunks.read(*reads[2]).read() == raw[SIZE * 2 : SIZE * 2 + 8]
        chunks.finish()


def test_a_file_is_cached_when_the_first_page_of_each_chunk_is_in_the_page_cache(data: Path) -> None:
    e = entry(data)
    data.read_bytes()
    assert cached(data.parent, e)
    evict(data)
    assert not cached(data.parent, e), "one read would wait on the disk"
    assert not cached(data.parent / "gone", e)


def test_small_tensors_are_written_after_the_others_each_in_the_plans_order(tmp_path: Path) -> None:
    state = {"a": torch.zeros(1 << 18), "a.step": torch.tensor(1.0), "b": torch.zeros(1 << 18), "c": [1]}
    metadata = dcp_save(state, storage_writer=HashingWriter(tmp_path, sync_files=False), no_dist=True)
    offsets = {index.fqn: info.offset for index, info in metadata.storage_data.items()}
    assert offsets["c"] < offsets["a"] < offsets["b"] < offsets["a.step"], "bytes, large, then small"
