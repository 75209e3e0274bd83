"""A preset built with fewer devices per node than it describes (``preset_cluster(name, 1, 4)``, as a 4-GPU world on
an 8-GPU preset) keeps the PCIe switch groups of the devices it has: the preset's groups of devices past the count
are not an error there, only in a node file as written."""
from __future__ import annotations

from sp_plan.profiles import preset_cluster, preset_spec
from sp_plan.profiles.spec import node_spec


def test_a_four_device_dgx_h100_builds():
    assert node_spec(preset_spec("dgx-h100"), 4)["devices_per_node"] == 4
    c = preset_cluster("dgx-h100", 1, 4)
    assert c.devices_per_node == 4 and c.world_size == 4
