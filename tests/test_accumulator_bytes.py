"""The gradient accumulators that travel between ranks are priced as the runtime priced keeps them.

sp-plan's runtime (and ring-flash-attention, which yunchang runs) accumulates dQ, dK and dV in fp32 and sends the
accumulators on as they are; TransformerEngine keeps them in the input's dtype (``Params.ring_merge``,
planner/merges.py). So a bf16 ring round's backward moves K, V at 2 bytes an element and dK, dV at 4, and their
last hop home 4; an fp32 model moves 4 throughout.
"""
import pytest

from sp_plan.planner import Workload
from sp_plan.planner.merges import MERGES
from sp_plan.planner.model import ModelSpec
from sp_plan.planner.schedules import Comm, Shape
from sp_plan.planner.usp import ring_steps, usp_buffer_bytes
from sp_plan.planner.wallfacer import wallfacer_steps

S, R = 32768, 8


def model(dtype="bf16"):
    return ModelSpec(layers=4, hidden=4096, heads=32, kv_heads=8, vocab=0, dtype=dtype)  # llama3-8b's attention


def shape(dtype="bf16", runtime="sp-plan", algorithm="ring", team=1, placement=None):
    return Shape(model(dtype), Workload(seq_len=S), dp=1, ulysses=1, ring=R, token_layout="contiguous",
                 algorithm=algorithm, team=team, placement=placement, merge=MERGES[runtime])


def kv_elements() -> float:
    """Elements of one rank's K (or V) block: N/R tokens x 8 KV heads x head dim 128."""
    return S / R * 8 * 128


def comms(steps, name):
    """[(bytes a send, sends)] of the phase ``name``, over the schedule's steps (equal sends pooled)."""
    found = [(p.nbytes, st.repeat) for st in steps for p in st.phases if isinstance(p, Comm) and p.name == name]
    return [(b, sum(k for x, k in found if x == b)) for b in dict.fromkeys(x for x, _ in found)]


@pytest.mark.parametrize("dtype, runtime, kv_bytes, grad_bytes", [
    ("bf16", "sp-plan", 2, 4), ("bf16", "yunchang", 2, 4), ("bf16", "transformer-engine", 2, 2),
    ("fp32", "sp-plan", 4, 4), ("fp32", "transformer-engine", 4, 4),
])
def test_a_ring_round_sends_k_v_in_the_input_dtype_and_dk_dv_in_the_accumulators(dtype, runtime, kv_bytes,
                                                                                  grad_bytes):
    c = shape(dtype, runtime)
    kv = kv_elements()
    assert comms(ring_steps(c, False), "ring p2p fwd") == [(2 * kv * kv_bytes, R - 1)]
    assert comms(ring_steps(c, True), "ring p2p bwd") == [(2 * kv * kv_bytes + 2 * kv * grad_bytes, R - 1)]
    assert comms(ring_steps(c, True), "ring p2p dk,dv home") == [(2 * kv * grad_bytes, 1)]


def test_the_rings_dk_dv_double_buffers_are_the_accumulators():
    """Training adds two buffers of dK and dV in the accumulators' dtype (and the fp32 dQ): a bf16 model's are
    twice its K, V buffers' bytes, an fp32 model's the same."""
    def backward_extra(dtype):
        c = shape(dtype)
        return usp_buffer_bytes(c, True) - usp_buffer_bytes(c, False)

    q_elements = S / R * 32 * 128
    assert backward_extra("bf16") == 2 * 2 * kv_elements() * 4 + q_elements * 4
    assert backward_extra("fp32") == 2 * 2 * kv_elements() * 4 + q_elements * 4


def test_wallfacer_sends_dq_and_reduces_its_partials_in_the_accumulators():
    """Backward, dQ travels one hop behind its Q bundle and home in fp32; the dK, dV return and the team's
    reduce-scatter of dQ, dK, dV too. Forward, the outputs' partials are reduce-scattered in fp32."""
    te, own = (shape("bf16", runtime, "wallfacer", team=2, placement="collective_intra")
               for runtime in ("transformer-engine", "sp-plan"))
    for name in ("wallfacer sub-ring dq home", "wallfacer dk,dv return", "wallfacer reduce-scatter dq,dk,dv"):
        (a, _), = comms(wallfacer_steps(te, True), name)
        (b, _), = comms(wallfacer_steps(own, True), name)
        assert b == 2 * a, name
    (a, _), = comms(wallfacer_steps(te, False), "wallfacer reduce-scatter out")
    (b, _), = comms(wallfacer_steps(own, False), "wallfacer reduce-scatter out")
    assert b == 2 * a
    (a, _), = comms(wallfacer_steps(te, True), "wallfacer sub-ring p2p bwd")
    (b, _), = comms(wallfacer_steps(own, True), "wallfacer sub-ring p2p bwd")
    q_bytes = 2 * S / R * 32 * 128 * 2  # the team's Q block of C N/P tokens, bf16
    assert b - a == q_bytes  # only the dQ behind the bundle grows: 2 -> 4 bytes an element
