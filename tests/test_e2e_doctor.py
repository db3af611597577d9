"""``hpc-ddp doctor`` on the real dev cluster (2 nodes, gloo): a healthy allocation passes with
one row set per node, and a real fault is found and blamed on the right node: the job's fixed
``dist.port`` already held by another process on n1 (rank 0's node)."""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e_util import hpc

if TYPE_CHECKING:
    from tests.conftest import Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

PER_NODE = ("python", "torch", "gpus", "run dir free", "run dir shared", "master port")


def doctor(cluster: Cluster, runs: Path, *args: str) -> tuple[int, dict[str, Any]]:
    done = hpc(cluster, "doctor", *args, "--runs-dir", str(runs), "--json", check=False)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout)


def test_a_healthy_allocation_passes_with_one_row_set_per_node(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    code, result = doctor(slurm_cluster, tmp_path, "jobs/quickstart.yaml", "--nodes", "2")
    assert (code, result["ok"]) == (0, True), result["summary"]
    assert result["summary"] == "doctor: every check passed on 2 node(s): n1, n2"
    rows = {(f["node"], f["check"]): f for f in result["findings"]}
    for rank, node in enumerate(("n1", "n2")):
        for check in PER_NODE:
            assert rows[(node, check)]["rank"] == rank
            assert rows[(node, check)]["verdict"] == "ok"
        # the interpreter the rendered script runs on the tasks: the one that submitted
        assert rows[(node, "python")]["value"].endswith(f"({sys.executable})")
    assert rows[("n2", "master port")]["value"].startswith("reached n1:")
    assert rows[("n2", "clock skew")]["verdict"] == "ok"
    assert rows[("n2", "p2p bandwidth")]["verdict"] == "ok"
    assert rows[("all", "all-reduce 32 MiB")]["verdict"] == "ok"
    assert "loopback: a TCP stream measured at" in rows[("all", "all-reduce 32 MiB")]["note"]


def test_a_master_port_held_by_another_process_is_blamed_on_rank_0s_node(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """A fixed dist.port that another process on n1 already listens on: rank 0 cannot listen,
    n2's hello goes to that process and gets no answer. Both rows fail, n1 is named, and n2
    gives up as soon as rank 0 says so rather than at the timeout."""
    with socket.socket() as squatter:
        squatter.bind(("0.0.0.0", 0))
        squatter.listen(8)
        port = squatter.getsockname()[1]
        began = time.monotonic()
        code, result = doctor(
            slurm_cluster, tmp_path, "--nodes", "2", f"dist.port={port}", "--timeout", "60"
        )
        took = time.monotonic() - began
    assert code == 1
    assert result["culprits"] == {"n1": ["master port"]}
    assert result["summary"] == "doctor: n1 is broken (master port)"
    rows = {(f["node"], f["check"]): f for f in result["findings"]}
    n1, n2 = rows[("n1", "master port")], rows[("n2", "master port")]
    assert (n1["verdict"], n1["value"]) == ("FAIL", f"cannot listen on {port}")
    assert "Address already in use" in n1["note"]
    assert (n2["verdict"], n2["blame"]) == ("FAIL", "n1")
    assert f"rank 0 cannot listen on port {port}" in n2["note"]
    assert took < 55, "n2 waited out the timeout instead of hearing from rank 0"
    assert rows[("all", "group checks")]["value"].startswith("skipped")
