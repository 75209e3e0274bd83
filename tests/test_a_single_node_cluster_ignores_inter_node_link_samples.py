"""Link samples of an inter-node class are ignored on a cluster of one node (there is no second node to price them
on): the intra-node fits are made as usual and no */inter fit appears, whether the links come straight to comm_fits
or through measured_params."""
import pytest

from sp_plan.planner.calibration import comm_fits, measured_params
from sp_plan.profiles import load_cluster

LINKS = {"classes": {
    "intra:shm": {"pair": [0, 1], "ops": {"p2p": {"group_size": 2, "alpha_s": 1e-4, "busbw": 4e9}}},
    "inter:ethernet": {"pair": [0, 4], "ops": {"p2p": {"group_size": 2, "alpha_s": 3e-4, "busbw": 1e9},
                                               "all_gather": {"group_size": 2, "alpha_s": 3e-4, "busbw": 0.25e9}}}}}


def test_inter_classes_give_no_fit_on_one_node():
    cl = load_cluster("cpu-local", 1)
    f = comm_fits(cl, LINKS)
    assert set(f) == {"p2p/intra"}
    assert f["p2p/intra"].efficiency == pytest.approx(0.8)
    assert set(measured_params(cl, "fp32", links=LINKS).comm) == {"p2p/intra"}
