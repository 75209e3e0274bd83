"""Without training, the search's compute-only bound (``Bounds.compute_bounds``) asked for the forward floor is the
exact one: a forward-only step has no backward to add and its attention is counted from its own schedule, so the
bound is the same whether or not the forward schedule was summed before, and never above the exact price."""
from __future__ import annotations

from sp_plan.planner import Workload
from sp_plan.planner.estimate import Estimator
from sp_plan.planner.search import Space, degree_groups
from sp_plan.profiles import load_cluster, load_model
from sp_plan.profiles.kernels import default_params


def test_an_inference_bound_with_the_forward_floor_is_the_exact_bound_and_below_the_price():
    cluster, model = load_cluster("dgx-h100", 1), load_model("llama3-8b")
    work = Workload(seq_len="32k", batch=4, training=False)
    pr = default_params(cluster)
    est, space = Estimator(cluster, model, work, params=pr), Space(cluster.world_size, model, work)
    d = next(d for d in space.degrees() if d.ring > 1)
    checked = 0
    for base, orders, fitting in degree_groups(est, space, d)[0][:4]:
        fresh = Estimator(cluster, model, work, params=pr)  # nothing summed yet: the floor would apply in training
        floored = fresh.bounds.compute_bounds(base, fitting, forward_floor=True)
        exact_bound = est.bounds.compute_bounds(base, fitting)
        price = est.evaluate_orders(base, est.orders(base.degrees, orders, base.placement), fitting)[0].min(axis=0)
        assert floored == exact_bound
        for lo, t in zip(floored, price):
            assert lo <= t
            checked += 1
    assert checked
