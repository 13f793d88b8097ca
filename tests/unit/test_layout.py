"""The storage layout's names and the integrity module's digests: what one writer names, the others find."""

import io
from pathlib import Path

import pytest

from ftrain.workers.integrity import (
    ALGORITHM,
    ALGORITHMS,
    Hashed,
    Hasher,
    UnknownAlgorithm,
    check_algorithm,
    digest_of,
    from_hex,
    hash_file,
    hash_files,
    hash_stream,
    to_hex,
)
from ftrain.workers.layout import (
    MANIFEST,
    MARKER,
    PARTIAL,
    RESERVED,
    SetAside,
    assemblies,
    assembly_dir,
    assembly_writer,
    attempt_file,
    checkpoint_path,
    complete_steps,
    parse_set_aside,
    parse_step,
    partial_path,
    process_writer,
    rank_stage_dir,
    run_dir,
    set_aside_path,
    set_asides,
    step_dir,
)

EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
ABC_SHA256 = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"

# -- names ---------------------------------------------------------------------------------------------------


def test_the_file_names_a_checkpoint_reserves() -> None:
    assert (MANIFEST, MARKER, PARTIAL) == ("manifest.json", ".complete", ".partial")
    assert frozenset({"manifest.json", ".complete"}) == RESERVED


def test_where_a_checkpoint_and_its_work_in_progress_live() -> None:
    root = Path("/ckpt")
    assert run_dir(root, "r1") == Path("/ckpt/r1")
    assert checkpoint_path(root, "r1", 20) == step_dir(Path("/ckpt/r1"), 20) == Path("/ckpt/r1/step-20")
    assert assembly_dir(Path("/ckpt/r1"), 20) == Path("/ckpt/r1/.step-20.tmp")
    assert assembly_dir(Path("/ckpt/r1"), 20, "w7") == Path("/ckpt/r1/.step-20.tmp-w7")
    assert partial_path(Path("/ckpt/r1/step-20/a.pt")) == Path("/ckpt/r1/step-20/a.pt.partial")
    assert rank_stage_dir(Path("/local"), 3) == Path("/local/rank-3")
    assert set_aside_path(Path("/ckpt/r1/step-20"), "corrupt", "t1") == Path("/ckpt/r1/step-20.corrupt-t1")


def test_the_attempt_owning_a_run_directory_is_named_in_its_dot_attempt_file() -> None:
    assert attempt_file(Path("/ckpt/r1")) == Path("/ckpt/r1/.attempt")


def test_a_process_names_its_assembly_by_host_pid_and_nonce_and_the_name_gives_them_back() -> None:
    assert process_writer("gpu-a-01", 4242, "n1") == "gpu-a-01-4242-n1"
    assembly = assembly_dir(Path("/ckpt/r1"), 20, process_writer("gpu-a-01", 4242, "n1"))
    assert assembly == Path("/ckpt/r1/.step-20.tmp-gpu-a-01-4242-n1")
    assert assembly_writer(assembly) == ("gpu-a-01", 4242)


@pytest.mark.parametrize(
    ("name", "writer"),
    [
        (".step-20.tmp-gpu01-4242-n1", ("gpu01", 4242)),
        (".step-20.tmp-gpu-a-01-7-n1", ("gpu-a-01", 7)),  # a host name may hold hyphens: split from the right
        (".step-20.tmp", None),  # the trainer's ranks share an unnamed one
        (".step-20.tmp-w7", None),  # a writer tag no process wrote
        (".step-20.tmp-gpu01-4242", None),
        (".step-20.tmp--4242-n1", None),  # no host
        (".step-20.tmp-gpu01-x42-n1", None),  # no pid
        ("step-20.tmp-gpu01-4242-n1", None),  # not an assembly directory
        ("step-20", None),
    ],
)
def test_an_assembly_names_the_host_and_pid_that_wrote_it_or_none(
    name: str, writer: tuple[str, int] | None
) -> None:
    assert assembly_writer(Path("/ckpt/r1") / name) == writer


@pytest.mark.parametrize(("name", "step"), [("step-0", 0), ("step-20", 20), ("step-007", 7)])
def test_a_checkpoint_directory_is_named_by_its_step(name: str, step: int) -> None:
    assert parse_step(name) == step


@pytest.mark.parametrize(
    "name", ["step-", "step-x", "xstep-1", "step-1x", "step-1.corrupt-t", ".step-1.tmp", "Step-1"]
)
def test_any_other_name_is_no_checkpoint(name: str) -> None:
    assert parse_step(name) is None


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("step-20.corrupt-t1", (20, "corrupt")),
        ("step-20.unrecorded-t1", (20, "unrecorded")),
        ("step-3.superseded-a-b", (3, "superseded")),
        ("step-20.corrupt-unrecorded-t1", (20, "unrecorded")),  # the name trainers wrote before the kind
        ("step-20.corrupt-", None),
        ("step-20.stale-t1", None),
        ("step-20", None),
        ("xstep-20.corrupt-t1", None),
    ],
)
def test_a_set_aside_name_says_its_step_and_why(name: str, parsed: tuple[int, str] | None) -> None:
    assert parse_set_aside(name) == parsed


def test_listing_finds_what_the_names_say_and_a_missing_run_is_empty(tmp_path: Path) -> None:
    run = tmp_path / "r1"
    for name in ("step-10", "step-30", "step-20", "step-40", "step-5.corrupt-b", "step-5.corrupt-a",
                 "step-2.superseded-x", ".step-50.tmp", ".step-60.tmp-w1", ".step-x.tmp", "notes"):  # fmt: skip
        (run / name).mkdir(parents=True)
    for name in ("step-10", "step-30", "step-20", "step-5.corrupt-a"):
        (run / name / MARKER).touch()
    (run / "step-40" / MANIFEST).touch()

    assert complete_steps(run) == [30, 20, 10]
    assert set_asides(run) == [
        SetAside(2, "superseded", run / "step-2.superseded-x"),
        SetAside(5, "corrupt", run / "step-5.corrupt-a"),
        SetAside(5, "corrupt", run / "step-5.corrupt-b"),
    ]
    assert sorted(assemblies(run)) == [run / ".step-50.tmp", run / ".step-60.tmp-w1"]
    missing = tmp_path / "nowhere"
    assert (complete_steps(missing), set_asides(missing), assemblies(missing)) == ([], [], [])


# -- digests -------------------------------------------------------------------------------------------------


def test_a_digest_names_its_algorithm_and_the_log_keeps_the_bare_hex() -> None:
    assert ALGORITHM == "sha256"
    assert digest_of(b"abc") == f"sha256:{ABC_SHA256}" == from_hex(ABC_SHA256)
    assert to_hex(digest_of(b"abc")) == ABC_SHA256
    assert to_hex(from_hex("sha256:x")) == "sha256:x", "only the algorithm prefix is removed, once"


def test_a_hasher_counts_and_digests_everything_that_passed() -> None:
    hasher = Hasher()
    assert hasher.result() == Hashed(0, from_hex(EMPTY_SHA256))
    hasher.update(b"a")
    hasher.update(memoryview(b"bc"))
    assert hasher.result() == Hashed(3, from_hex(ABC_SHA256))


def test_a_stream_is_hashed_in_one_pass() -> None:
    data = bytes(range(256)) * 1000
    assert hash_stream(io.BytesIO(data)) == Hashed(len(data), digest_of(data))
    assert hash_stream(io.BytesIO(b"abc")) == Hashed(3, from_hex(ABC_SHA256))


def test_files_are_hashed_in_order_and_an_unreadable_one_yields_its_error(tmp_path: Path) -> None:
    paths = [tmp_path / name for name in ("a", "b", "c")]
    paths[0].write_bytes(b"abc")
    paths[2].write_bytes(b"")
    assert hash_file(paths[0]) == Hashed(3, from_hex(ABC_SHA256))
    first, missing, empty = hash_files([(p, ALGORITHM) for p in paths], threads=2)
    assert (first, empty) == (Hashed(3, from_hex(ABC_SHA256)), Hashed(0, from_hex(EMPTY_SHA256)))
    assert isinstance(missing, FileNotFoundError)


ABC_BLAKE3 = "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"
"""BLAKE3 of b"abc", as the reference implementation's `b3sum` prints it."""


def test_blake3_digests_name_their_algorithm_whichever_way_the_bytes_pass(tmp_path: Path) -> None:
    assert ALGORITHMS == ("sha256", "blake3")
    assert digest_of(b"abc", "blake3") == f"blake3:{ABC_BLAKE3}"
    hasher = Hasher("blake3")
    hasher.update(b"a")
    hasher.update(memoryview(b"bc"))
    assert hasher.result() == Hashed(3, digest_of(b"abc", "blake3"))
    assert hash_stream(io.BytesIO(b"abc"), "blake3") == hasher.result()
    (tmp_path / "abc").write_bytes(b"abc")
    assert hash_file(tmp_path / "abc", "blake3") == hasher.result()
    mixed = hash_files([(tmp_path / "abc", "blake3"), (tmp_path / "abc", "sha256")])
    assert mixed == [Hashed(3, f"blake3:{ABC_BLAKE3}"), Hashed(3, from_hex(ABC_SHA256))]


@pytest.mark.parametrize("name", ["md5", "crc32", "SHA256", "sha-256", ""])
def test_no_other_algorithm_is_hashed_with(name: str) -> None:
    with pytest.raises(UnknownAlgorithm, match=f"digest algorithm {name!r} is unknown"):
        check_algorithm(name)
    with pytest.raises(UnknownAlgorithm):
        Hasher(name)
    assert check_algorithm("blake3") == "blake3"


def test_a_step_directory_that_is_a_link_is_no_checkpoint_of_the_run(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere" / "step-30"
    elsewhere.mkdir(parents=True)
    (elsewhere / MARKER).write_bytes(b"x")
    run = tmp_path / "run"
    (run / "step-10").mkdir(parents=True)
    (run / "step-10" / MARKER).write_bytes(b"x")
    (run / "step-30").symlink_to(elsewhere)
    assert complete_steps(run) == [10]
