"""One suite of cases for the storage port's run store (`workers.storage.port.RunStorage`), run against every
backend the trainer saves to: the file system, SeaweedFS and moto (as the eventsourcing library's recorder
tests do: one base class of cases, one subclass per backend). No mocks: the S3 cases talk HTTP to real
servers, and a writer killed mid-write is a real process sent SIGKILL."""

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlparse

import pytest

from ftrain.domain.lifecycle import OnDisk
from ftrain.workers.integrity import digest_of, to_hex
from ftrain.workers.layout import MANIFEST
from ftrain.workers.manifest import FileEntry, Manifest
from ftrain.workers.storage.file.run_dir import FileRun
from ftrain.workers.storage.location import Location, run_location
from ftrain.workers.storage.one_rank import write_step
from ftrain.workers.storage.open import open_run
from ftrain.workers.storage.port import Readable, RunStorage, StoredCheckpoint
from ftrain.workers.storage.s3.run_prefix import S3Run
from ftrain.workers.storage.storage_errors import CheckpointExists, Fenced, StorageError, StorageUnavailable
from ftrain.workers.verified_chunks import LocalChunks, Rejected, VerifiedChunks
from tests.support.rank_files import write_rank
from tests.support.s3 import Endpoint

RUN = "conf-run"
FILES = {"__0_0.distcp": b"rank zero's shard" * 100, ".metadata": b"metadata bytes", "__1_0.distcp": b"one"}


def as_loaded(local: Readable, entry: FileEntry, mine: Sequence[FileEntry]) -> bytes:
    """A data file's bytes as a load gets them: a file with chunk digests left for the load (or not this
    rank's) read chunk by chunk from the backend's source, each chunk verified (Rejected when one fails);
    another from the readable directory, fetched there first when the backend fetches on demand."""
    owned = {e.name for e in mine}
    if local.chunked and entry.chunked and (entry.name in local.left or entry.name not in owned):
        source = local.source or LocalChunks(local.path)
        whole = [(entry.name, 0, entry.size)]
        with VerifiedChunks(source, {entry.name: entry}, whole, {entry.name}) as chunks:
            data = chunks.read(entry.name, 0, entry.size).read()
            chunks.finish()
        return data
    if local.fetch is not None and entry.name not in owned:
        local.fetch(entry.name)
    return (local.path / entry.name).read_bytes()


class Backend:
    """How the cases reach one backend: a run's store, its raw bytes (to damage them), and a store whose
    storage is out of reach."""

    def __init__(self, root: str, stage: Path, env: dict[str, str], endpoint: Endpoint | None = None) -> None:
        self.root, self.stage, self.env, self.endpoint = root, stage, env, endpoint

    def location(self, run: str = RUN) -> Location:
        return run_location(f"{self.root}/{run}")

    def store(self, run: str = RUN) -> RunStorage:
        if self.endpoint is None:
            return FileRun(self.location(run), self.stage)
        return S3Run(self.location(run), self.stage, self.endpoint.client())

    def overwrite(self, uri: str, name: str, data: bytes) -> None:
        """Replace one stored file of the step at `uri` with `data` (damage from outside ftrain)."""
        parsed = urlparse(uri)
        if self.endpoint is None:
            Path(parsed.path, name).write_bytes(data)
        else:
            key = f"{parsed.path.strip('/')}/{name}"
            self.endpoint.client().put_object(Bucket=parsed.netloc, Key=key, Body=data)

    def names(self, run: str = RUN) -> list[str]:
        """The entries directly under the run's location (on S3: its objects' first key segments)."""
        if self.endpoint is None:
            return sorted(os.listdir(self.location(run).path))
        bucket, prefix = self.location(run).bucket_prefix
        listed = self.endpoint.client().list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/{run}/")
        return sorted(
            {o["Key"][len(prefix) + len(run) + 2 :].split("/")[0] for o in listed.get("Contents", [])}
        )

    def unwritable(self) -> RunStorage | None:
        """A store of the run this job can never write: under /proc, or with a secret the store refuses
        (None: moto admits any)."""
        if self.endpoint is None:
            return FileRun(run_location(f"/proc/nope/{RUN}"), self.stage)
        if not self.endpoint.checks_credentials:
            return None
        return S3Run(self.location(), self.stage, self.endpoint.client(secret_key="wrong"))

    def out_of_reach(self) -> RunStorage:
        """A store of the run where the storage cannot answer: a file system path through a regular file
        (ENOTDIR, as an unmounted or stale mount answers), a bucket that does not exist."""
        if self.endpoint is None:
            blocker = self.stage.parent / "not-a-directory"
            blocker.write_bytes(b"")
            return FileRun(run_location(blocker / RUN), self.stage)
        return S3Run(
            run_location(f"s3://no-such-bucket-{os.getpid()}/ckpt/{RUN}"), self.stage, self.endpoint.client()
        )


def manifest(step: int, entries: list[FileEntry]) -> Manifest:
    return Manifest(
        run_id=RUN,
        step=step,
        epoch=0,
        shards=2,
        world_size=2,
        dataset_revision=None,
        created_at=datetime.now(UTC),
        files=tuple(sorted(entries, key=lambda e: e.name)),
    )


def save(store: RunStorage, step: int, attempt: int = 0, *, staged: bool = False) -> StoredCheckpoint:
    """What the trainer's ranks do, as one process: begin, each rank's files written and delivered, seal."""
    uri = store.begin(step, attempt)
    entries = []
    for rank, names in enumerate(([".metadata", "__0_0.distcp"], ["__1_0.distcp"])):
        mine = write_rank(store, uri, step, rank, {name: FILES[name] for name in names}, staged=staged)
        # chunk digests (format 3) are listed where a local file is written, not by an S3 stream
        assert [(e.name, e.size, e.digest) for e in mine] == [
            (n, len(FILES[n]), digest_of(FILES[n])) for n in sorted(names)
        ]
        entries += mine
    return store.seal(uri, manifest(step, entries), attempt)


class StoreCases:
    """The cases every backend passes; a subclass supplies `backend`."""

    @pytest.fixture
    def store(self, backend: Backend) -> RunStorage:
        return backend.store()

    @pytest.mark.parametrize("staged", [False, True])
    def test_a_saved_step_is_complete_confined_and_its_manifest_checks_out(
        self, store: RunStorage, staged: bool
    ) -> None:
        written = save(store, 10, staged=staged)

        assert store.complete() == [OnDisk(10, written.uri, written.checkpoint_hash)]
        assert store.confined(written.uri) == written.uri
        read = store.read_manifest(written.uri, written.checkpoint_hash, run_id=RUN, step=10)
        assert read == written.manifest and {e.name for e in written.manifest.files} == set(FILES)
        assert (
            store.read_manifest(written.uri, to_hex(digest_of(b"other")), run_id=RUN, step=10)
            == "hash mismatch"
        )
        assert isinstance(store.read_manifest(written.uri, None, run_id=RUN, step=11), str), "another step's"

    def test_each_ranks_files_are_readable_locally_verified_and_the_rest_fetched(
        self, store: RunStorage, backend: Backend
    ) -> None:
        written = save(store, 10)
        mine = [e for e in written.manifest.files if e.name != "__1_0.distcp"]
        store.prepare(0, staged=True)
        with store.readable(written.uri, written.manifest, mine, start="s1", rank=0) as local:
            assert local.verdict is None
            assert all(as_loaded(local, e, mine) == FILES[e.name] for e in mine)
            other = next(e for e in written.manifest.files if e.name == "__1_0.distcp")
            assert as_loaded(local, other, mine) == FILES["__1_0.distcp"]
        assert not [p for p in backend.stage.rglob("*") if p.is_file()], "nothing left in the work space"

    def test_damaged_bytes_are_a_verdict_naming_the_file(self, store: RunStorage, backend: Backend) -> None:
        written = save(store, 10)
        backend.overwrite(written.uri, "__0_0.distcp", b"x" * len(FILES["__0_0.distcp"]))
        store.prepare(0, staged=True)
        with store.readable(
            written.uri, written.manifest, written.manifest.files, start="s2", rank=0
        ) as local:
            verdict = local.verdict
            if verdict is None:  # a file left for the load to check chunk by chunk, checked as a load does
                try:
                    for entry in written.manifest.files:
                        as_loaded(local, entry, written.manifest.files)
                except Rejected as exc:
                    verdict = str(exc)
            assert verdict == "file __0_0.distcp hash mismatch"
        backend.overwrite(written.uri, MANIFEST, b"{}")
        assert (
            store.read_manifest(written.uri, written.checkpoint_hash, run_id=RUN, step=10)
            == "manifest unreadable"
        )

    def test_storage_out_of_reach_is_unavailable_never_corrupt(self, backend: Backend) -> None:
        gone = backend.out_of_reach()
        uri = f"{gone.location.uri}/step-10"
        for call in (
            gone.complete,
            gone.reachable,
            lambda: gone.read_manifest(uri, None, run_id=RUN, step=10),
        ):
            with pytest.raises(StorageUnavailable):
                call()

    def test_prune_deletes_the_retired_steps_and_nothing_else(self, store: RunStorage) -> None:
        for step in (10, 20, 30, 40):
            save(store, step)
        assert store.prune([20, 10, 5], 0) == [20, 10], "a step not there is not deleted"
        assert [d.step for d in store.complete()] == [40, 30]

    def test_the_fence_stops_an_older_attempt_from_sealing_or_pruning(self, store: RunStorage) -> None:
        assert store.owner() == 0
        store.claim(2)
        assert store.owner() == 2
        with pytest.raises(Fenced):
            store.claim(1)
        store.check(2)
        save(store, 10, attempt=2)
        save(store, 20, attempt=2)
        save(store, 30, attempt=2)
        with pytest.raises(Fenced):
            save(store, 40, attempt=1)
        with pytest.raises(Fenced):
            store.prune([10], 1)
        assert [d.step for d in store.complete()] == [30, 20, 10] and store.owner() == 2

    def test_an_older_attempts_step_of_the_same_name_is_set_aside_not_trusted(
        self, store: RunStorage
    ) -> None:
        old = save(store, 10, attempt=1)
        new = save(store, 10, attempt=2)
        assert store.complete() == [OnDisk(10, new.uri, new.checkpoint_hash)]
        assert new.checkpoint_hash != old.checkpoint_hash

    def test_quarantine_frees_the_steps_name_and_keeps_the_bytes(self, store: RunStorage) -> None:
        written = save(store, 10)
        moved = store.quarantine(written.uri, "corrupt", "7")
        assert moved is not None and moved.rstrip("/").endswith("step-10.corrupt-7")
        assert store.complete() == [] and store.confined(moved) is not None
        assert store.quarantine(written.uri, "corrupt", "8") is None, "gone: nothing to move"
        save(store, 10)
        assert [d.step for d in store.complete()] == [10]

    def test_a_discarded_save_leaves_nothing_and_the_step_can_be_saved_again(self, store: RunStorage) -> None:
        uri = store.begin(10, 0)
        write_rank(store, uri, 10, 0, {"__0_0.distcp": b"half"})
        store.discard(uri)
        assert store.complete() == [] and store.clean() == []
        save(store, 10)
        assert [d.step for d in store.complete()] == [10]

    def test_confined_refuses_every_uri_outside_the_runs_own_steps(
        self, store: RunStorage, backend: Backend
    ) -> None:
        written = save(store, 10)
        other = save(backend.store("other-run"), 10)
        assert store.confined(other.uri) is None
        base = store.location.uri
        for uri in (base, f"{base}/step-10/x", f"{base}/../other-run/step-10", "s3://elsewhere/ckpt/step-1"):
            assert store.confined(uri) is None, uri
        assert store.confined(written.uri) == written.uri

    def test_a_writer_killed_mid_write_leaves_no_step_and_clean_removes_its_work(
        self, backend: Backend
    ) -> None:
        """A real process begins step 10, writes and delivers its files, and is SIGKILLed before it seals:
        the step is absent (never half there), `clean` removes what it left, and the step saves again."""
        code = textwrap.dedent(f"""
            import sys
            from pathlib import Path
            from ftrain.workers.storage.location import run_location
            from ftrain.workers.storage.open import open_run
            from tests.support.rank_files import write_files
            store = open_run(run_location({backend.location().uri!r}), Path({str(backend.stage)!r}))
            uri = store.begin(10, 1)
            with store.rank_files(uri, 10, 0, staged=True) as target:
                store.deliver(uri, target, write_files(store, uri, target, {{"__0_0.distcp": b"half" * 1000}}))
                print("delivered", flush=True)
                sys.stdin.read()
        """)
        env = {**os.environ, **backend.env}
        child = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        try:
            assert child.stdout is not None and child.stdout.readline() == b"delivered\n"
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(30)
        store = backend.store()
        step = f"{store.location.uri}/step-10"
        assert store.complete() == []
        assert isinstance(store.read_manifest(step, None, run_id=RUN, step=10), str)
        assert store.clean(), "the dead writer's partial work is removed"
        assert store.clean() == []
        save(store, 10, attempt=1)
        assert [d.step for d in store.complete()] == [10]

    def test_the_start_up_probe_writes_reads_back_and_leaves_nothing(
        self, store: RunStorage, backend: Backend
    ) -> None:
        store.probe()  # a first start: the run's location is made
        save(store, 10)
        store.probe()
        assert backend.names() == ["step-10"], "the probe is gone; nothing else was written"
        assert store.complete()[0].step == 10 and store.clean() == []

    def test_the_probe_tells_a_location_that_is_wrong_from_one_out_of_reach(self, backend: Backend) -> None:
        """Out of reach (a path through a regular file, a bucket that does not answer) may come back: it is
        unavailable, as for every read. A location this job can never write (a path nobody can create, a
        secret the store refuses) answers the same next time: it is wrong (StorageError), never retried."""
        with pytest.raises(StorageUnavailable):
            backend.out_of_reach().probe()
        if (wrong := backend.unwritable()) is not None:
            with pytest.raises(StorageError, match=r"^checkpoint location \S+ cannot be written: \S+"):
                wrong.probe()

    def test_quarantined_lists_the_steps_set_aside_as_corrupt_only(self, store: RunStorage) -> None:
        assert store.quarantined() == []
        corrupt = store.quarantine(save(store, 10).uri, "corrupt", "7")
        store.quarantine(save(store, 20).uri, "superseded", "8")
        store.quarantine(save(store, 30).uri, "unrecorded", "9")
        save(store, 40)
        assert store.quarantined() == [corrupt]

    def test_a_one_rank_writer_puts_its_files_and_a_taken_step_refuses_it(
        self, backend: Backend, tmp_path: Path
    ) -> None:
        """The CLI's writer: outside the attempts, with no work space, its files put from where they are; a
        step already there is refused, never set aside; `verify` judges every file where it lies."""
        store = open_run(backend.location())
        local = tmp_path / "shard"
        local.write_bytes(FILES["__0_0.distcp"])
        sources: list[tuple[str, bytes | Path]] = [("state.json", b"{}"), ("__0_0.distcp", local)]
        written = write_step(store, run_id=RUN, step=10, epoch=1, shards=1, sources=sources)
        assert store.complete() == [OnDisk(10, written.uri, written.checkpoint_hash)]
        assert store.verify(written.uri, written.checkpoint_hash, run_id=RUN, step=10) is None
        assert store.verify(written.uri, to_hex(digest_of(b"other"))) == "hash mismatch"
        with pytest.raises(CheckpointExists):
            write_step(store, run_id=RUN, step=10, epoch=1, shards=1, sources=[("state.json", b"[]")])
        backend.overwrite(written.uri, "__0_0.distcp", b"x" * len(FILES["__0_0.distcp"]))
        assert store.verify(written.uri, written.checkpoint_hash) == "file __0_0.distcp hash mismatch"
        with pytest.raises(StorageError):
            write_step(store, run_id=RUN, step=20, epoch=1, shards=1, sources=[(MANIFEST, b"{}")])
        store.discard(written.uri)
        assert store.complete() == [] and backend.names() == []

    def test_the_factory_opens_this_backend_from_a_location(
        self, store: RunStorage, backend: Backend
    ) -> None:
        opened = open_run(backend.location(), backend.stage)
        assert type(opened) is type(store) and opened.location == store.location


class TestFileSystem(StoreCases):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> Backend:
        return Backend((tmp_path / "ckpt").as_uri(), tmp_path / "stage", {})


def s3_backend(found: Endpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Backend:
    """A fresh bucket; the factory's shared client (the standard AWS chain) pointed at the server too."""
    for name, value in found.env().items():
        monkeypatch.setenv(name, value)
    return Backend(f"s3://{found.new_bucket()}/ckpt", tmp_path / "stage", found.env(), found)


class TestSeaweedFS(StoreCases):
    @pytest.fixture
    def backend(self, weed: Endpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Backend:
        return s3_backend(weed, tmp_path, monkeypatch)


class TestMoto(StoreCases):
    @pytest.fixture
    def backend(self, moto: Endpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Backend:
        return s3_backend(moto, tmp_path, monkeypatch)
