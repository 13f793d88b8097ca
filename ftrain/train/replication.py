"""Snapshot parts between nodes, on the memory tier's gloo group: bytes as uint8 tensors, never pickled, so
what arrives is only written, then verified against a manifest the log vouches for before anything reads it.

`swap` is the background replication (each rank sends its part to its buddy while receiving its source's);
`send_part` and `receive_part` move one replica back to the rank that lost its part, at resume, with the
manifest's bytes in front (a length header of two int64 first: the manifest's bytes, the files' bytes).
"""

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup, Work


def _tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _sending(tensor: torch.Tensor, to: int, group: ProcessGroup) -> Work:
    work = dist.isend(tensor, dst=to, group=group)
    assert work is not None  # every rank is in the tier's group
    return work


def _received(size: int, source: int, group: ProcessGroup) -> bytes:
    buffer = torch.empty(size, dtype=torch.uint8)
    dist.recv(buffer, src=source, group=group)
    return buffer.numpy().tobytes()


def swap(group: ProcessGroup, to: int, sent: bytes, source: int, size: int) -> bytes:
    """Send `sent` to rank `to` while receiving `size` bytes from rank `source`: both at once, so a ring of
    ranks never waits on itself."""
    out = _sending(_tensor(sent), to, group)
    try:
        return _received(size, source, group)
    finally:
        out.wait()


def send_part(group: ProcessGroup, to: int, manifest: bytes, files: bytes) -> list[Work]:
    """Start sending a part (its manifest's bytes, then its files concatenated) to rank `to`; the sends to
    wait for."""
    header = torch.tensor([len(manifest), len(files)], dtype=torch.int64)
    return [_sending(t, to, group) for t in (header, _tensor(manifest + files))]


def receive_part(group: ProcessGroup, source: int) -> tuple[bytes, bytes]:
    """A part sent by `send_part` from rank `source`: (its manifest's bytes, its files concatenated)."""
    header = torch.empty(2, dtype=torch.int64)
    dist.recv(header, src=source, group=group)
    manifest_size, files_size = (int(n) for n in header.tolist())
    sent = _received(manifest_size + files_size, source, group)
    return sent[:manifest_size], sent[manifest_size:]
