"""The all-to-all through the CPU: link class "host" and its default efficiency, by hand."""
import pytest

from sp_plan.planner.engine import GroupShape, LinkEngine
from sp_plan.planner.params import CommFit, Params
from sp_plan.profiles import load_cluster
from sp_plan.profiles.kernels import HOST_A2A_EFFICIENCY, comm_defaults, default_params


def test_all_to_all_across_the_sockets_is_the_cpus_and_costs_its_efficiency():
    """8 x L20, switches of 2, two under each socket: each GPU sends 1/8 of V to each of the 4 GPUs of the other
    socket, so the socket link carries 4 x 4 x V/8 = 2 V each way at 20 GB/s: 2 V / 20e9 / (2/32) + latency."""
    cl = load_cluster("l20-8-pcie")
    eng, shape = LinkEngine(cl), GroupShape(((8, 1),), 8)
    c = eng.cost("all_to_all", shape)
    assert c.link_class == "host" and "(smp)" in c.bottleneck
    assert c.sec_per_byte == pytest.approx(2 / 20e9)
    t = eng.time("all_to_all", shape, 1e9, default_params(cl))
    assert t == pytest.approx(1e9 * 2 / 20e9 / (2 / 32) + c.latency)
    assert t == pytest.approx(1.6 + c.latency)


def test_all_to_all_inside_a_switch_and_over_the_network_are_not_the_cpus():
    """Ulysses 2 on the first switch (GPUs 0, 1) never reaches the host bridge: the PCIe figure (0.89); Ulysses 4
    (GPUs 0-3, two switches) goes up through the CPU: its figure; a 16-wide all-to-all on two DGX H100s is limited
    by the NICs: the network's (0.96)."""
    cl = load_cluster("l20-8-pcie")
    eng, shape = LinkEngine(cl), GroupShape(((2, 1),), 8)
    c = eng.cost("all_to_all", shape)
    assert c.link_class == "intra"
    assert eng.time("all_to_all", shape, 1e9, default_params(cl)) == pytest.approx(1e9 * c.sec_per_byte / 0.89 + c.latency)
    four = GroupShape(((4, 1),), 8)
    c4 = eng.cost("all_to_all", four)
    assert c4.link_class == "host" and "(pcie)" in c4.bottleneck
    assert eng.time("all_to_all", four, 1e9, default_params(cl)) == pytest.approx(
        1e9 * c4.sec_per_byte / (2 / 32) + c4.latency)
    dgx = LinkEngine(load_cluster("dgx-h100", 2))
    assert dgx.cost("all_to_all", GroupShape(((16, 1),), 16)).link_class == "inter"
    assert dgx.cost("all_to_all", GroupShape(((8, 1),), 16)).link_class == "intra"  # NVSwitch, no CPU on the path


def test_a_ring_across_the_sockets_keeps_the_pcie_figure():
    """Only the all-to-all has a host figure: a shift whose busiest link is the socket link falls back to the
    intra-node fit (bytes over 0.89 x 20 GB/s)."""
    cl = load_cluster("l20-8-pcie")
    eng, shape = LinkEngine(cl), GroupShape(((8, 1),), 8)
    c = eng.cost("shift", shape)
    assert c.link_class == "host"
    assert eng.time("shift", shape, 1e9, default_params(cl)) == pytest.approx(1e9 / 20e9 / 0.89 + c.latency)


def test_host_falls_back_to_intra_and_a_host_fit_wins():
    intra = CommFit(efficiency=0.5)
    host = CommFit(efficiency=0.25)
    assert Params(comm={"p2p/intra": intra}).comm_fit("shift", "host") is intra
    assert Params(comm={"p2p/intra": intra, "p2p/host": host}).comm_fit("shift", "host") is host
    assert Params(comm={"p2p/intra": intra, "p2p/host": host}).comm_fit("shift", "intra") is intra
    assert Params().comm_fit("all_to_all", "host") is None
    assert Params(comm={"p2p/intra": intra}).comm_fit("shift", "inter") is None


def test_host_default_only_on_pcie_boxes():
    assert HOST_A2A_EFFICIENCY == pytest.approx(0.0625)
    assert comm_defaults(load_cluster("l20-8-pcie"))["all_to_all/host"].efficiency == pytest.approx(2 / 32)
    assert comm_defaults(load_cluster("a10-4-pcie"))["all_to_all/host"].efficiency == pytest.approx(2 / 32)
    for preset in ("dgx-h100", "dgx-a100", "a100-16-eth100"):
        assert not [k for k in comm_defaults(load_cluster(preset, 2)) if k.endswith("/host")]


def test_bench_fidelity_ablates_the_host_term_alone(script):
    """`bench_fidelity.py --ablate`'s "-host-a2a" column: the defaults less the host fit, the rest kept."""
    bf = script("benchmarks/bench_fidelity.py")
    cl = load_cluster("l20-8-pcie")
    full, less = default_params(cl), bf.params_for("after-host-a2a", cl)
    assert "all_to_all/host" in full.comm and "all_to_all/host" not in less.comm
    assert less == full.model_copy(update={"comm": {k: v for k, v in full.comm.items() if k != "all_to_all/host"}})
    assert bf.params_for("after-round", cl).round_overhead_s == 0.0  # the static terms as before


def test_bench_fidelity_prices_each_paper_with_its_runtimes_merge(script):
    """USP Tables 3-4 ran yunchang, Tables 5-7 Megatron-LM's context parallel (TransformerEngine): "after" prices
    each table with that runtime's ring merge, ``--merge NAME`` every table with one; "before" stays Params()."""
    bf = script("benchmarks/bench_fidelity.py")
    cl = load_cluster("l20-8-pcie")
    assert bf.RUNTIMES == {"usp_attention": "yunchang", "usp_training": "transformer-engine"}
    assert bf.params_for("after", cl, {"ring_merge": "yunchang"}) == default_params(cl).model_copy(
        update={"ring_merge": "yunchang"})
    assert bf.params_for("after-hbm", cl, {"ring_merge": "yunchang"}).ring_merge == "yunchang"
    assert bf.params_for("before", cl, {"ring_merge": "yunchang"}) == Params()
    assert default_params(cl).ring_merge == "sp-plan"  # what `sp-plan plan` prices: its own runtime
