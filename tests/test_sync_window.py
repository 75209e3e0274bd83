"""The gradient sync's window: the backward's wall time less what its own transfers hold the sync's link class for
(``estimate.sync_window``, ``estimate.held_links``), so a faster device never prices a layout slower."""
from __future__ import annotations

import numpy as np
import pytest

from sp_plan.planner import Candidate, Estimator, Workload
from sp_plan.planner.estimate import Orders, add_held, sync_window
from sp_plan.planner.params import LINK_CLASSES
from sp_plan.planner.schedules import Comm, Compute, Step
from sp_plan.planner.search import Space, degree_groups
from sp_plan.profiles import load_cluster, load_model

INTRA, INTER = LINK_CLASSES.index("intra"), LINK_CLASSES.index("inter")


def _step(overlap: bool, repeat: int = 1) -> Step:
    phases = (Compute("block", 1.0), Comm("a", "shift", ("ring",), 1.0), Comm("b", "shift", ("ring",), 1.0),
              Comm("c", "shift", ("ring",), 1.0))
    return Step(phases, repeat, overlap=overlap)


def test_held_links_sums_a_plain_steps_phases_and_takes_the_longest_of_an_overlapped_ones():
    comms = [np.array([1.0, 4.0]), np.array([2.0, 1.0]), np.array([3.0, 5.0])]
    classes = [np.array([INTER, INTRA]), np.array([INTER, INTRA]), np.array([INTRA, INTER])]  # per order
    cols = np.arange(2)
    plain = np.zeros((len(LINK_CLASSES), 2))
    add_held(plain, _step(False, repeat=3), comms, classes, cols)
    assert plain[INTER].tolist() == [9.0, 15.0] and plain[INTRA].tolist() == [9.0, 15.0]
    both = np.ones((len(LINK_CLASSES), 2))  # added to what is held already
    add_held(both, _step(True, repeat=2), comms, classes, cols)
    assert both[INTER].tolist() == [5.0, 11.0] and both[INTRA].tolist() == [7.0, 9.0]
    one = np.zeros((len(LINK_CLASSES), 2))
    add_held(one, _step(True, repeat=2), comms[:1], classes[:1], cols)  # one transfer: itself, without a max
    assert one[INTER].tolist() == [2.0, 0.0] and one[INTRA].tolist() == [0.0, 8.0]


def test_the_sync_window_is_the_wall_less_the_time_its_links_are_held():
    from sp_plan.planner.estimate import Priced

    links = np.zeros((len(LINK_CLASSES), 2))
    links[INTER] = [3.0, 9.0]
    links[INTRA] = [1.0, 0.0]
    bwd = Priced(np.array([5.0, 10.0]), 2.0, (), links)
    assert sync_window(bwd, [np.array([INTER, INTER])]).tolist() == [2.0, 1.0]
    assert sync_window(bwd, [np.array([INTRA, INTRA])]).tolist() == [4.0, 10.0]  # the backward's whole wall, >= compute
    assert sync_window(bwd, [np.array([INTRA, INTER]), np.array([INTER, INTRA])]).tolist() == [2.0, 1.0]  # the most held
    assert sync_window(Priced(np.array([5.0, 10.0]), 2.0, ()), [np.array([INTER, INTER])]).tolist() == [5.0, 10.0]


def test_a_sync_on_links_the_backward_leaves_free_hides_behind_its_whole_wall_time():
    """A ring inside each node (NVLink) with data parallelism across the nodes: the sync crosses the network, the
    ring's transfers do not, so the whole backward (its transfers' exposed time too) is the sync's window."""
    cl, m = load_cluster("a100-16-eth100", 2), load_model("tiny-llama")
    est = Estimator(cl, m, Workload(seq_len=65536, batch=2))
    cand = Candidate("ring", dp=2, ring=cl.devices_per_node, order=("ring", "dp"), token_layout="zigzag")
    c = est.shape(cand)
    orders = Orders(est.engine, cand.degrees, [cand.order], cand.placement)
    bwd = est.price_part("bwd", c, orders)
    syncs = est.grad_syncs(c, 0, orders)
    assert [int(orders.classes(p)[0]) for p, _ in syncs] == [INTER]
    assert bwd.links[INTER, 0] == 0 and bwd.links[INTRA, 0] > 0
    assert sync_window(bwd, [orders.classes(p) for p, _ in syncs])[0] == bwd.seconds[0] > bwd.compute


def _faster(cluster, k: float):
    """The cluster with every device's peak FLOP/s times ``k`` (links as they are)."""
    data = cluster.model_dump()
    for node in data["node_types"].values():
        for dev in node["devices"]:
            dev["peak_flops"] = {dt: f * k for dt, f in dev["peak_flops"].items()}
    return type(cluster).model_validate(data)


@pytest.mark.parametrize("batch", [1, 2])
def test_a_faster_device_never_prices_a_layout_slower(batch):
    """Every candidate (each algorithm variant, token layout, mesh order and fitting policy) of a slow-network
    cluster, at twice the peak FLOP/s: no step gets slower, where the sync's window were the backward's compute
    alone it would (a faster device shortens it while the ring's transfers keep the backward as long)."""
    cl, m = load_cluster("a100-16-eth100", 2), load_model("llama3-8b")
    work = Workload(seq_len="32k", batch=batch)
    slow, fast = Estimator(cl, m, work), Estimator(_faster(cl, 2.0), m, work)
    space = Space(cl.world_size, m, work)
    compared = faster = 0
    for d in space.degrees():
        for base, orders, fitting in degree_groups(slow, space, d)[0]:
            t0 = slow.evaluate_orders(base, slow.orders(base.degrees, orders, base.placement), fitting)[0]
            t1 = fast.evaluate_orders(base, fast.orders(base.degrees, orders, base.placement), fitting)[0]
            assert np.all(t1 <= t0 * (1 + 1e-12)), (base, fitting, t0, t1)
            compared += t0.size
            faster += int(np.sum(t1 < t0 * (1 - 1e-3)))
    assert compared > 1000 and faster > compared // 2


def test_gradient_accumulation_syncs_once_under_zero0_and_1_and_every_micro_batch_under_zero2_and_3():
    """Four times the micro-batches a step (batch 16 against 4 on dp 2): ZeRO-0 and 1 reduce once, in the last
    micro-batch's backward (the same bytes and exposed seconds); ZeRO-2 reduce-scatters every micro-batch (its
    weights' all-gather still once); ZeRO-3 gathers and reduce-scatters every micro-batch: 4x the bytes and the
    exposed seconds, each micro-batch's passes hiding the same share."""
    cl, m = load_cluster("a100-16-eth100", 2), load_model("tiny-llama")
    cand = Candidate("ring", dp=2, ring=cl.world_size // 2, order=("ring", "dp"), token_layout="zigzag")

    def rows(batch: int, zero: int) -> dict:
        est = Estimator(cl, m, Workload(seq_len=8192, batch=batch))
        return {r.name: (r.bytes_per_rank, r.exposed_seconds) for r in est.predict(cand.but(zero_stage=zero)).breakdown
                if r.name.startswith(("grad", "param"))}

    for zero, times in ((0, {"grad all-reduce": 1}), (1, {"grad reduce-scatter": 1, "param all-gather": 1}),
                        (2, {"grad reduce-scatter": 4, "param all-gather": 1}),
                        (3, {"param all-gather fwd": 4, "param all-gather bwd": 4, "grad reduce-scatter": 4})):
        few, many = rows(4, zero), rows(16, zero)
        assert set(few) == set(many) == set(times)
        for name, k in times.items():
            assert many[name][0] == pytest.approx(k * few[name][0], rel=1e-12), (zero, name)
        exposed = [sum(x for _, x in r.values()) for r in (few, many)]
        assert exposed[0] > 0
        if zero in (0, 3):
            assert exposed[1] == pytest.approx((1 if zero == 0 else 4) * exposed[0], rel=1e-9), zero


def test_the_sync_hides_behind_the_forward_the_backward_recomputes():
    """Checkpointing recomputes a layer's forward inside the backward, and the buckets already reduced sync beside
    it: the more it recomputes (none, the linear layers, the whole layer), the less of the sync is exposed, never
    below the last bucket's share and never more than the sync's seconds."""
    cl, m = load_cluster("a100-16-eth100", 2), load_model("tiny-llama")
    cand = Candidate("ring", dp=2, ring=cl.world_size // 2, order=("ring", "dp"), token_layout="zigzag", zero_stage=1)
    est = Estimator(cl, m, Workload(seq_len=4096, batch=2))

    def sync(ckpt: str) -> tuple[float, float]:
        rows = [r for r in est.predict(cand.but(checkpointing=ckpt)).breakdown if r.name.startswith(("grad", "param"))]
        return sum(r.exposed_seconds for r in rows), sum(r.seconds for r in rows)

    (none, total), (linear, _), (full, _) = sync("none"), sync("attention_boundary"), sync("full")
    assert total > none > linear > full > 0
    c = est.shape(cand)
    assert full >= est.sync_bucket(c, 1) * total * (1 - 1e-9)
