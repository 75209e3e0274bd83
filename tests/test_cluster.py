"""Cluster model: presets, YAML round trip, fingerprint, graph, and clear errors for broken files."""
from pathlib import Path

import pytest

from sp_plan.planner import Cluster, PlanError
from sp_plan.profiles import cluster_presets, load_cluster, preset_cluster

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("name", cluster_presets())
def test_every_preset_builds_and_round_trips(name, tmp_path):
    c = preset_cluster(name, 2)
    g = c.graph()
    assert c.world_size == 2 * c.devices_per_node
    devices = [n for n, a in g.nodes(data=True) if a.get("role") == "device"]
    assert len(devices) == c.world_size
    assert all(g.edges[e]["capacity"] > 0 for e in g.edges)
    c.save(tmp_path / "c.yaml")
    back = Cluster.load(tmp_path / "c.yaml")
    assert back == c and back.fingerprint() == c.fingerprint()
    assert c.source  # every preset cites its published specs


def test_fingerprint_names_topology_not_labels():
    a, b = preset_cluster("dgx-h100", 2), preset_cluster("dgx-h100", 2)
    b.name = "renamed"
    assert a.fingerprint() == b.fingerprint()
    assert a.fingerprint() != preset_cluster("dgx-h100", 3).fingerprint()
    assert a.fingerprint() != preset_cluster("dgx-a100", 2).fingerprint()


def test_preset_memory_is_what_nvml_reports_and_its_fingerprints_are_those_plans_were_keyed_to(tmp_path):
    """An H100 reports 81,559 MiB (what `discover` writes); the fingerprints are computed with the datasheet's
    decimal 80e9 (``fingerprint_memory``), which the fixtures' plan file and profile are keyed by."""
    from sp_plan.planner.plan import Plan
    from sp_plan.planner.profile import Profile

    c = preset_cluster("dgx-h100", 2)
    assert c.device(0).memory_bytes == 81559 * 2**20
    assert c.fingerprint() == Plan.load(FIXTURES / "plans" / "usp-16-with-groups.yaml").cluster_fingerprint
    assert c.topology_fingerprint() == Profile.load(FIXTURES / "profile-dgx-h100.yaml").cluster_fingerprint
    c.save(tmp_path / "c.yaml")
    assert Cluster.load(tmp_path / "c.yaml").fingerprint() == c.fingerprint()  # written with the file
    data = c.model_dump(exclude={"fingerprint_memory"})
    assert Cluster.model_validate(data).fingerprint() != c.fingerprint()  # the figure is what keeps them
    with pytest.raises(PlanError, match="fingerprint_memory.dgx-a100: unknown node type"):
        Cluster.model_validate({**data, "fingerprint_memory": {"dgx-a100": 80e9}})


def test_directed_links_carry_capacity_per_direction():
    g = preset_cluster("a100-16-eth100", 2).graph()
    assert g.edges["n0.nic0", "net"]["capacity"] == 12.5e9
    assert g.edges["net", "n1.nic0"]["kind"] == "ethernet"
    assert g.edges["n0.gpu3", "n0.nvswitch"]["capacity"] == 300e9


def test_missing_link_is_named(tmp_path):
    c = preset_cluster("a10-4-pcie")
    data = c.model_dump(mode="json")
    nt = data["node_types"]["a10-4-pcie"]
    nt["links"] = [l for l in nt["links"] if not (l["src"] == "gpu3")]
    import yaml
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(PlanError, match="links: no path from gpu0 to gpu3 inside the node"):
        Cluster.load(tmp_path / "c.yaml")


def test_link_to_unknown_endpoint_and_zero_nodes(tmp_path):
    c = preset_cluster("a10-4-pcie")
    data = c.model_dump(mode="json")
    data["node_types"]["a10-4-pcie"]["links"][0]["dst"] = "gpu9"
    with pytest.raises(PlanError, match=r"links\[0\]: endpoint 'gpu9'"):
        Cluster.model_validate(data)
    with pytest.raises(PlanError, match="nodes: must be at least 1"):
        load_cluster("dgx-h100", 0)


def test_preset_spec_file_and_cluster_file_both_load(tmp_path):
    c = preset_cluster("dgx-a100", 2)
    c.save(tmp_path / "mine.yaml")
    assert load_cluster(str(tmp_path / "mine.yaml")) == c
    with pytest.raises(PlanError, match="describes 2 node"):
        load_cluster(str(tmp_path / "mine.yaml"), 3)


def test_a_preset_clusters_name_reads_back_as_its_node_type_and_count():
    """``preset_name`` names a preset cluster and ``preset_nodes`` reads it back (a plan's cluster name tells which
    --nodes it was made for); a name without xN is one node."""
    from sp_plan.planner.cluster import preset_name, preset_nodes
    from sp_plan.profiles import preset_cluster

    for node, nodes in (("dgx-h100", 1), ("dgx-h100", 2), ("a100-16-eth100", 16), ("cpu-local", 128)):
        assert preset_nodes(preset_name(node, nodes)) == (node, nodes)
        assert preset_cluster(node, nodes).name == preset_name(node, nodes)
    assert preset_nodes("my-cluster") == ("my-cluster", 1)


def test_routes_follow_bandwidth_whatever_the_latencies():
    """Inside a node the route is the one with bandwidth to spare: a PCIe tree whose latency is below the NVSwitch's
    (as `profile links` can set it from a measured alpha) does not take GPU-to-GPU traffic off the NVSwitch."""
    from sp_plan.planner.cluster import NodeType

    (node,) = load_cluster("dgx-h100").node_types.values()
    for pcie, nvswitch in ((3e-6, 2e-6), (0.5e-6, 2e-6), (3e-6, 5e-6)):
        links = [l.model_copy(update={"latency": {"pcie": pcie, "nvswitch": nvswitch}.get(l.kind, l.latency)})
                 for l in node.links]
        g = NodeType(devices=node.devices, switches=node.switches, links=links).link_graph()
        assert g.shortest_path("gpu0", "gpu1") == ["gpu0", "nvswitch", "gpu1"], (pcie, nvswitch)
