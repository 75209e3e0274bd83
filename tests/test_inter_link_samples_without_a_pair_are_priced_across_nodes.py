"""An inter-node link sample that names no pair is priced where the probe places it: rank 0 and the first rank of the
next node, across the nodes' NICs, not two ranks of one node. On cpu-local x2 (one 1.25 GB/s NIC per node, 80 us per
hop) 1 GB/s and 300 us measured on such a pair are an efficiency of 0.8 and 140 us beyond its path."""
import pytest

from sp_plan.planner.calibration import comm_fits
from sp_plan.profiles import load_cluster


def test_an_inter_sample_without_a_pair_fits_as_the_cross_node_pair_does():
    cl = load_cluster("cpu-local", 2)
    ops = {"p2p": {"group_size": 2, "alpha_s": 3e-4, "busbw": 1e9}}
    bare = comm_fits(cl, {"classes": {"inter:ethernet": {"ops": ops}}})
    assert bare["p2p/inter"].efficiency == pytest.approx(0.8)
    assert bare["p2p/inter"].alpha_s == pytest.approx(1.4e-4)
    assert bare == comm_fits(cl, {"classes": {"inter:ethernet": {"pair": [0, cl.devices_per_node], "ops": ops}}})
