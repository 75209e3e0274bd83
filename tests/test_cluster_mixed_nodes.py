"""A cluster whose nodes differ: the cost engine prices every node like node 0, so nodes of different sizes are
refused (a rank's node is found by division), and nodes of one size but other hardware are planned with a note."""
from __future__ import annotations

import copy

import pytest
from typer.testing import CliRunner

from sp_plan.cli.app import app
from sp_plan.planner.cluster import Cluster
from sp_plan.planner.engine import LinkEngine
from sp_plan.planner.errors import PlanError
from sp_plan.profiles import load_cluster


def mixed(other_devices: int | None = None) -> Cluster:
    """Two a10-4-pcie nodes, the second of another node type: its devices renamed, or cut to ``other_devices``."""
    c = load_cluster("a10-4-pcie", 2)
    data = c.model_dump()
    (name,) = data["node_types"]
    other = copy.deepcopy(data["node_types"][name])
    for dev in other["devices"]:
        dev["model"] = "A10-24GB-b"
    if other_devices is not None:
        keep = {d["name"] for d in other["devices"][:other_devices]}
        other["devices"] = other["devices"][:other_devices]
        other["links"] = [l for l in other["links"] if not ({l["src"], l["dst"]} & ({d["name"] for d in
                          data["node_types"][name]["devices"]} - keep))]
    data["node_types"]["a10-b"] = other
    data["nodes"] = [name, "a10-b"]
    return Cluster.model_validate(data)


def test_nodes_of_different_sizes_are_refused_by_the_engine():
    c = mixed(other_devices=2)
    assert c.world_size == 6 and c.node_of(5) == 1
    with pytest.raises(PlanError) as e:
        LinkEngine(c)
    assert e.value.field == "cluster.nodes" and "a10-4-pcie: 4" in str(e.value) and "a10-b: 2" in str(e.value)


def test_nodes_of_one_size_are_planned_with_a_note(tmp_path):
    path = tmp_path / "mixed.yaml"
    mixed().save(path)
    res = CliRunner().invoke(app, ["plan", "--cluster", str(path), "--model", "gpt-3b", "--seq-len", "8k",
                                   "--top", "1", "-o", str(tmp_path / "p.yaml")])
    assert res.exit_code == 0, res.output
    assert "note: cluster: its nodes are of 2 types (a10-4-pcie, a10-b); every node is priced like node 0's " \
           "a10-4-pcie" in " ".join(res.output.split())
    est = CliRunner().invoke(app, ["estimate", str(tmp_path / "p.yaml"), "--cluster", str(path)])
    assert est.exit_code == 0, est.output
    assert "note: cluster: its nodes are of 2 types" in est.output


def test_a_plan_of_nodes_of_different_sizes_exits_2_naming_nodes(tmp_path):
    path = tmp_path / "mixed.yaml"
    mixed(other_devices=2).save(path)
    res = CliRunner().invoke(app, ["plan", "--cluster", str(path), "--model", "gpt-3b", "--seq-len", "8k"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "nodes" in res.output and "different numbers of devices" in res.output
