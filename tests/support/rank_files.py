"""One rank's files of a step written as the trainer writes them, without DCP's planning: through the writer the
store hands out (`StepWriter.dcp_writer`: into a directory, or streamed to the store from memory), then
delivered."""

from collections.abc import Mapping

from ftrain.workers.integrity import ALGORITHM
from ftrain.workers.manifest import FileEntry
from ftrain.workers.storage.port import RankFiles, StepWriter


def write_files(
    store: StepWriter, uri: str, target: RankFiles, files: Mapping[str, bytes]
) -> list[FileEntry]:
    """`files` (name → bytes) written into `target` through the store's writer, as DCP writes each file; their
    entries, hashed as written."""
    writer = store.dcp_writer(uri, target, ALGORITHM)
    for name, data in files.items():
        with writer.fs.create_stream(writer.fs.concat_path(writer.path, name), "wb") as stream:
            stream.write(data)
    return writer.entries()


def write_rank(
    store: StepWriter, uri: str, step: int, rank: int, files: Mapping[str, bytes], *, staged: bool = False
) -> list[FileEntry]:
    """One rank's `files` of the step begun at `uri`, written and delivered; their entries."""
    with store.rank_files(uri, step, rank, staged=staged) as target:
        entries = write_files(store, uri, target, files)
        store.deliver(uri, target, entries)
    return entries
