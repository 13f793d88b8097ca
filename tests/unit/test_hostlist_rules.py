"""Each hostlist refusal as one exact line naming the host, the list or the file at fault."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ftrain.supervise.hostlist import (
    Allocation,
    HostlistError,
    compress_hostlist,
    expand_hostlist,
    read_pbs_nodefile,
)


def refused(message: str) -> pytest.RaisesExc[HostlistError]:
    return pytest.raises(HostlistError, match=f"^{re.escape(message)}$")


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("  ", "empty hostlist"),
        ("a,b!", "invalid character '!' in host 'b!' of hostlist 'a,b!'"),
        ("a,n[]", "empty brackets in 'n[]'"),
        ("a,n[0-999],m[0-999999]", "hostlist 'a,n[0-999],m[0-999999]' expands to more than 1,000,000 hosts"),
    ],
)
def test_a_malformed_hostlist_is_refused_naming_what_is_wrong(expr: str, message: str) -> None:
    with refused(message):
        expand_hostlist(expr)


def test_a_name_without_digits_never_joins_a_numbered_group() -> None:
    assert compress_hostlist(["node1", "node", "node2"]) == "node1,node,node2"
    assert expand_hostlist("node1,node,node2") == ["node1", "node", "node2"]


def test_a_pbs_nodefile_refusal_names_the_file(tmp_path: Path) -> None:
    nodefile = tmp_path / "nodes"
    with refused(
        f"cannot read PBS nodefile {str(nodefile)!r}: [Errno 2] No such file or directory: {str(nodefile)!r}"
    ):
        read_pbs_nodefile(nodefile)
    nodefile.write_text("gpu01\n\n")
    assert read_pbs_nodefile(nodefile) == ["gpu01"]
    nodefile.write_text("gpu01\nbad host\n")
    with refused(f"invalid host name 'bad host' on line 2 of PBS nodefile {str(nodefile)!r}"):
        read_pbs_nodefile(nodefile)
    nodefile.write_text("\n \n")
    with refused(f"PBS nodefile {str(nodefile)!r} lists no hosts"):
        read_pbs_nodefile(nodefile)


def test_an_allocation_has_hosts() -> None:
    with refused("allocation has no hosts"):
        Allocation(hosts=(), source="slurm")
