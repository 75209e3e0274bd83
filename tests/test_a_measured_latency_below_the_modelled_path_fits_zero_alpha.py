"""A link whose measured fixed cost per step is below the engine's own path latency (the preset overstates the
latency) fits a fixed cost of 0, never a negative one: the engine already charges the path latency, and a negative
alpha is not a valid fit. On cpu-local x2 a pair of one node has a 40 us path; 10 us measured leaves nothing to add,
and the bandwidth is still fitted (4 of the modelled 5 GB/s)."""
import pytest

from sp_plan.planner.calibration import comm_fits
from sp_plan.profiles import load_cluster


def test_alpha_below_the_path_latency_is_clamped_to_zero():
    cl = load_cluster("cpu-local", 2)
    links = {"classes": {"intra:shm": {"pair": [0, 1], "ops": {
        "p2p": {"group_size": 2, "alpha_s": 1e-5, "busbw": 4e9},
        "all_gather": {"group_size": 4, "alpha_s": 3e-5, "busbw": 2.5e9}}}}}  # 10 us a step of 3, path 40 us
    f = comm_fits(cl, links)
    assert f["p2p/intra"].alpha_s == 0.0 and f["p2p/intra"].efficiency == pytest.approx(0.8)
    assert f["all_gather/intra"].alpha_s == 0.0 and f["all_gather/intra"].efficiency == pytest.approx(0.5)
