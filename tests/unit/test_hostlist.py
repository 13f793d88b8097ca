"""Hostlist expansion/compression, PBS nodefiles and allocation resolution."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ftrain.supervise.hostlist import (
    MAX_HOSTS,
    Allocation,
    HostlistError,
    compress_hostlist,
    expand_hostlist,
    is_valid_hostname,
    read_pbs_nodefile,
    resolve_allocation,
)

# --------------------------------------------------------------------------- expand


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("node07", ["node07"]),
        ("node[07-10]", ["node07", "node08", "node09", "node10"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[098-100]", ["n098", "n099", "n100"]),
        ("n[1-010]", ["n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8", "n9", "n10"]),
        ("node[07-08,10]", ["node07", "node08", "node10"]),
        (
            "node[07-08,10],gpu-a[1-3]",
            ["node07", "node08", "node10", "gpu-a1", "gpu-a2", "gpu-a3"],
        ),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("a[1-2]b[3-4]c", ["a1b3c", "a1b4c", "a2b3c", "a2b4c"]),
        ("linux[0-1]x", ["linux0x", "linux1x"]),
        ("n[5]", ["n5"]),
        ("n[007]", ["n007"]),
        ("n[3,1,2]", ["n3", "n1", "n2"]),
        ("[1-3]", ["1", "2", "3"]),
        ("login,node[1-2],login", ["login", "node1", "node2", "login"]),
        ("n1,n1,n[1-2]", ["n1", "n1", "n1", "n2"]),
        ("tux[0,7-8]", ["tux0", "tux7", "tux8"]),
        ("host.example.com,node_a[1-2].dc", ["host.example.com", "node_a1.dc", "node_a2.dc"]),
        ("  node[1-2]\n", ["node1", "node2"]),
    ],
)
def test_expand_examples(expr: str, expected: list[str]) -> None:
    assert expand_hostlist(expr) == expected


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("", "empty hostlist"),
        ("   ", "empty hostlist"),
        ("node[1-2", "unbalanced '['"),
        ("node1-2]", "unbalanced ']'"),
        ("node[1]]", "unbalanced ']'"),
        ("node[[1-2]]", "nested '['"),
        ("a,,b", "empty item #2"),
        (",a", "empty item #1"),
        ("a,", "empty item #2"),
        ("node[5-3]", "reversed range '5-3'"),
        ("node[a-b]", "non-numeric range 'a-b'"),
        ("node[1-b]", "non-numeric range '1-b'"),
        ("node[-2]", "non-numeric range '-2'"),
        ("node[1-]", "non-numeric range '1-'"),
        ("node[1-2-3]", "non-numeric range '1-2-3'"),
        ("node[]", "empty brackets"),
        ("node[1,]", "empty range element"),
        ("node[,1]", "empty range element"),
        ("node 1", "whitespace at position 4"),
        ("node[1, 2]", "whitespace at position 7"),
        ("node\t1", "whitespace at position 4"),
        ("node:1", "invalid character ':'"),
        ("node/[1-2]", "invalid character '/'"),
        ("n[1-1000001]", "more than 1,000,000 hosts"),
        ("n[1-1001]m[1-1000]", "more than 1,000,000 hosts"),
        ("a[1-500000],b[1-500001]", "more than 1,000,000 hosts"),
        ("n[0-99999999999999999999]", "more than 1,000,000 hosts"),
    ],
)
def test_expand_rejects_malformed(expr: str, message: str) -> None:
    with pytest.raises(HostlistError, match=message.replace("[", r"\[")) as info:
        expand_hostlist(expr)
    assert "\n" not in str(info.value)


def test_expand_limit_is_inclusive() -> None:
    assert MAX_HOSTS == 1_000_000
    hosts = expand_hostlist("n[1-999999],m7")
    assert len(hosts) == MAX_HOSTS
    assert hosts[0] == "n1"
    assert hosts[-2:] == ["n999999", "m7"]


def test_hostlist_error_is_value_error() -> None:
    assert issubclass(HostlistError, ValueError)


# --------------------------------------------------------------------------- compress


@pytest.mark.parametrize(
    ("hosts", "expected"),
    [
        ([], ""),
        (["node07"], "node07"),
        (["node07", "node08", "node10"], "node[07-08,10]"),
        (
            ["node07", "node08", "node10", "gpu-a1", "gpu-a2", "gpu-a3"],
            "node[07-08,10],gpu-a[1-3]",
        ),
        (["n8", "n9", "n10"], "n[8-10]"),
        (["n098", "n099", "n100"], "n[098-100]"),
        (["n9", "n010"], "n[9,010]"),
        (["n007", "n8"], "n[007,8]"),
        (["n3", "n1", "n2"], "n[3,1-2]"),
        (["n1", "n1"], "n[1,1]"),
        (["login", "login", "head"], "login,login,head"),
        (["rack1-n01", "rack1-n02", "rack2-n01"], "rack1-n[01-02],rack2-n01"),
        (["a1b", "a2b", "a3c"], "a[1-2]b,a3c"),
        (["n1", "m2", "n3"], "n1,m2,n3"),
    ],
)
def test_compress_examples(hosts: list[str], expected: str) -> None:
    assert compress_hostlist(hosts) == expected
    if hosts:
        assert expand_hostlist(expected) == hosts


@pytest.mark.parametrize("bad", ["", "node 1", "n[1]", "a,b", "nöde"])
def test_compress_rejects_invalid_names(bad: str) -> None:
    with pytest.raises(HostlistError, match="invalid host name"):
        compress_hostlist(["ok1", bad])


# --------------------------------------------------------------------------- properties

_prefixes = st.sampled_from(["node", "n", "gpu-a", "rack1-n", "h.", "x_", ""])
_padded_hosts = st.builds(
    lambda prefix, number, width: f"{prefix}{str(number).zfill(width)}",
    _prefixes,
    st.integers(min_value=0, max_value=2000),
    st.integers(min_value=1, max_value=5),
)
_any_hosts = st.text(alphabet="abz019.-_", min_size=1, max_size=8)


@given(st.lists(_padded_hosts, min_size=1, max_size=40))
def test_roundtrip_padded_hosts_any_order(hosts: list[str]) -> None:
    """Holds for any order and with duplicates: compress never reorders or drops hosts."""
    assert expand_hostlist(compress_hostlist(hosts)) == hosts


@given(st.lists(_padded_hosts, min_size=1, max_size=40, unique=True).map(sorted))
def test_roundtrip_sorted_unique(hosts: list[str]) -> None:
    assert expand_hostlist(compress_hostlist(hosts)) == hosts


@given(st.lists(_any_hosts, min_size=1, max_size=20))
def test_roundtrip_arbitrary_valid_names(hosts: list[str]) -> None:
    assert expand_hostlist(compress_hostlist(hosts)) == hosts


@given(st.sampled_from(["node", "gpu-a", "r1-n"]), st.integers(0, 5000), st.integers(0, 300))
def test_consecutive_run_compresses_to_one_range(prefix: str, start: int, span: int) -> None:
    hosts = [f"{prefix}{n}" for n in range(start, start + span + 1)]
    expected = f"{prefix}{start}" if span == 0 else f"{prefix}[{start}-{start + span}]"
    assert compress_hostlist(hosts) == expected


@given(
    st.sampled_from(["node", "n", "gpu-a"]),
    st.integers(0, 10_000),
    st.integers(0, 200),
    st.integers(1, 6),
)
def test_expand_range_count_and_padding(prefix: str, lo: int, span: int, width: int) -> None:
    hi = lo + span
    lo_text = str(lo).zfill(width)
    hosts = expand_hostlist(f"{prefix}[{lo_text}-{hi}]")
    assert len(hosts) == hi - lo + 1
    assert hosts == [prefix + str(n).zfill(len(lo_text)) for n in range(lo, hi + 1)]
    assert all(len(h) - len(prefix) >= len(lo_text) for h in hosts)


@given(st.lists(st.tuples(st.integers(1, 4), st.integers(0, 3)), min_size=1, max_size=3))
def test_product_size_is_product_of_group_sizes(groups: list[tuple[int, int]]) -> None:
    expr = "h" + "-".join(f"[{lo}-{lo + span}]" for lo, span in groups)
    expected = 1
    for _, span in groups:
        expected *= span + 1
    assert len(expand_hostlist(expr)) == expected


# --------------------------------------------------------------------------- PBS


def test_pbs_nodefile_dedups_in_first_seen_order(tmp_path: Path) -> None:
    nodefile = tmp_path / "nodes"
    nodefile.write_text("node02\nnode02\n\nnode01\n  node02  \nnode01\nnode03\n")
    assert read_pbs_nodefile(nodefile) == ["node02", "node01", "node03"]


def test_pbs_nodefile_without_trailing_newline(tmp_path: Path) -> None:
    nodefile = tmp_path / "nodes"
    nodefile.write_text("a.cluster\r\nb.cluster")
    assert read_pbs_nodefile(nodefile) == ["a.cluster", "b.cluster"]


def test_pbs_nodefile_missing(tmp_path: Path) -> None:
    with pytest.raises(HostlistError, match="cannot read PBS nodefile"):
        read_pbs_nodefile(tmp_path / "absent")


def test_pbs_nodefile_is_directory(tmp_path: Path) -> None:
    with pytest.raises(HostlistError, match="cannot read PBS nodefile"):
        read_pbs_nodefile(tmp_path)


def test_pbs_nodefile_not_utf8(tmp_path: Path) -> None:
    nodefile = tmp_path / "nodes"
    nodefile.write_bytes(b"node\xff\n")
    with pytest.raises(HostlistError, match="cannot read PBS nodefile"):
        read_pbs_nodefile(nodefile)


def test_pbs_nodefile_empty(tmp_path: Path) -> None:
    nodefile = tmp_path / "nodes"
    nodefile.write_text("\n\n")
    with pytest.raises(HostlistError, match="lists no hosts"):
        read_pbs_nodefile(nodefile)


def test_pbs_nodefile_invalid_host(tmp_path: Path) -> None:
    nodefile = tmp_path / "nodes"
    nodefile.write_text("node01\nnode02 slots=4\n")
    with pytest.raises(HostlistError, match="on line 2"):
        read_pbs_nodefile(nodefile)


# --------------------------------------------------------------------------- allocation


def test_allocation_rank0_and_frozen() -> None:
    alloc = Allocation(hosts=("node07", "node08"), source="slurm")
    assert alloc.rank0_host == "node07"
    with pytest.raises(AttributeError):
        alloc.hosts = ("x",)  # type: ignore[misc]


def test_allocation_rejects_empty_and_unknown_source() -> None:
    with pytest.raises(HostlistError, match="no hosts"):
        Allocation(hosts=(), source="slurm")
    with pytest.raises(HostlistError, match="unknown allocation source"):
        Allocation(hosts=("a",), source="lsf")


def test_allocation_msgspec_roundtrip() -> None:
    alloc = Allocation(hosts=("node07", "node08"), source="pbs")
    assert msgspec.json.decode(msgspec.json.encode(alloc), type=Allocation) == alloc


def _pbs_env(tmp_path: Path, *hosts: str) -> dict[str, str]:
    nodefile = tmp_path / "pbs_nodes"
    nodefile.write_text("".join(f"{h}\n" for h in hosts))
    return {"PBS_NODEFILE": str(nodefile)}


def test_resolve_explicit_nodelist_wins(tmp_path: Path) -> None:
    env = {"SLURM_JOB_NODELIST": "s[1-2]", **_pbs_env(tmp_path, "p1", "p2")}
    alloc = resolve_allocation("node[07-08]", env, 2)
    assert alloc == Allocation(hosts=("node07", "node08"), source="nodelist")


def test_resolve_explicit_plain_comma_list() -> None:
    alloc = resolve_allocation("b,a,c", {}, 3)
    assert alloc == Allocation(hosts=("b", "a", "c"), source="nodelist")


def test_resolve_slurm_over_pbs(tmp_path: Path) -> None:
    env = {"SLURM_JOB_NODELIST": "s[1-2]", "SLURM_NODELIST": "old[1-2]", **_pbs_env(tmp_path, "p1")}
    assert resolve_allocation(None, env, 2) == Allocation(hosts=("s1", "s2"), source="slurm")


def test_resolve_slurm_nodelist_fallback() -> None:
    env = {"SLURM_NODELIST": "old[1-2]"}
    assert resolve_allocation(None, env, 2) == Allocation(hosts=("old1", "old2"), source="slurm")
    env_empty_job = {"SLURM_JOB_NODELIST": "", "SLURM_NODELIST": "old3"}
    assert resolve_allocation(None, env_empty_job, 1).hosts == ("old3",)


def test_resolve_pbs(tmp_path: Path) -> None:
    env = _pbs_env(tmp_path, "p2", "p2", "p1", "p1")
    assert resolve_allocation(None, env, 2) == Allocation(hosts=("p2", "p1"), source="pbs")


def test_resolve_pbs_unreadable(tmp_path: Path) -> None:
    with pytest.raises(HostlistError, match="cannot read PBS nodefile"):
        resolve_allocation(None, {"PBS_NODEFILE": str(tmp_path / "gone")}, 1)


def test_resolve_localhost_dev_mode() -> None:
    unrelated = {"HOME": "/root", "SLURM_JOB_NODELIST": "", "PBS_NODEFILE": ""}
    for nodes in (1, 4):
        alloc = resolve_allocation(None, unrelated, nodes)
        assert alloc == Allocation(hosts=("localhost",), source="localhost")
        assert alloc.rank0_host == "localhost"


def test_resolve_takes_first_n_hosts() -> None:
    env = {"SLURM_JOB_NODELIST": "node[07-10]"}
    assert resolve_allocation(None, env, 2).hosts == ("node07", "node08")


def test_resolve_too_small_allocation() -> None:
    env = {"SLURM_JOB_NODELIST": "node07"}
    with pytest.raises(HostlistError) as info:
        resolve_allocation(None, env, 2)
    assert str(info.value) == "allocation has 1 host(s) (node07) but --nodes 2 was asked (source: slurm)"


def test_resolve_counts_distinct_hosts() -> None:
    with pytest.raises(HostlistError, match=r"allocation has 2 host\(s\) \(n\[1-2\]\) but --nodes 3"):
        resolve_allocation("n1,n2,n1", {}, 3)
    assert resolve_allocation("n1,n1,n2", {}, 2).hosts == ("n1", "n2")


def test_resolve_too_small_pbs(tmp_path: Path) -> None:
    with pytest.raises(HostlistError, match=r"has 1 host\(s\) \(p1\) but --nodes 2 .*source: pbs"):
        resolve_allocation(None, _pbs_env(tmp_path, "p1", "p1", "p1"), 2)


def test_resolve_rejects_bad_nodes_and_bad_lists() -> None:
    with pytest.raises(HostlistError, match="--nodes must be >= 1"):
        resolve_allocation(None, {}, 0)
    with pytest.raises(HostlistError, match="empty hostlist"):
        resolve_allocation("", {"SLURM_JOB_NODELIST": "n1"}, 1)
    with pytest.raises(HostlistError, match="invalid character"):
        resolve_allocation(None, {"SLURM_JOB_NODELIST": "n1;rm"}, 1)


@pytest.mark.parametrize(
    ("name", "ok"),
    [("node07", True), ("a.b-c_d", True), ("", False), ("a b", False), ("a:1", False), ("ü", False)],
)
def test_is_valid_hostname(name: str, ok: bool) -> None:
    assert is_valid_hostname(name) is ok
