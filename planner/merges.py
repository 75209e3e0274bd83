"""The out/LSE merge of a ring round as each attention runtime runs it: the device-memory bytes it moves.

A ring round computes a block's partial out and LSE and folds them into the rank's accumulators (FlashAttention-2's
rescaling, online softmax); backward, it accumulates the block's dQ, dK, dV. That is memory-bound work, priced as
bytes over ``Params.hbm_bandwidth``, and how many bytes depends on the code that runs it: an eager merge reads and
writes fp32 accumulators op by op, a fused one passes over them once. ``Params.ring_merge`` names the runtime;
``planner/schedules.merge_bytes`` reads its entry here. Counted per aten op, every tensor argument read and every
result written (views free), unless the entry says the code is fused.
"""
from __future__ import annotations

from typing import NamedTuple


class MergeBytes(NamedTuple):
    """Bytes of one round's merge: forward ``out_e`` x e + ``out`` per local out element (the block's out read
    included) and ``lse`` per LSE element; backward ``grad_e`` x e + ``grad`` per dQ, dK, dV element."""

    out_e: float
    out: float
    lse: float
    grad_e: float
    grad: float
    carried: float = 4.0  # bytes per element of the gradient accumulators a round sends on (fp32); 0: the input's

    def carried_bytes(self, e: float) -> float:
        """Bytes per element of a dQ, dK or dV accumulator that travels between ranks, for inputs of e bytes."""
        return max(e, self.carried)

    def forward(self, e: float) -> float:
        """Bytes per local out element of one forward merge, for elements of e bytes."""
        return self.out_e * e + self.out

    def backward(self, e: float) -> float:
        """Bytes per dQ, dK, dV element of one backward accumulation, for elements of e bytes."""
        return self.grad_e * e + self.grad


#: runtime -> its merge. The USP paper's Tables 3-4 ran yunchang, its Tables 5-7 Megatron-LM's context parallel
#: (TransformerEngine); sp-plan's own runtime is the default (what `sp-plan tune` measures).
MERGES: dict[str, MergeBytes] = {
    # runtime/kernels.merge, eager: the block's out read (e), out.mul_(w_old) 8, block_out x w_new 4, out.add_ 12;
    # LSE: logaddexp, the finite reference, two subtractions, two exps, the copy back (86). Backward: dQ, dK, dV
    # each added into an fp32 accumulator (read e + 4, write 4), which the rounds send on as it is. Counted:
    # tests/test_fidelity_terms.py
    "sp-plan": MergeBytes(1, 24, 86, 1, 8),
    # feifeibear/long-context-attention (yunchang) as of May 2024 (USP's Tables 3-4, its yunchang/ring/utils.py):
    # ring-flash-attention's log-form update under torch.jit.script, run op by op (zhuzilin/ring-flash-attention#87,
    # vllm-project/vllm-omni#5187): block_out to fp32 (e + 4), exp(lse - new) x out 8, exp(blse - new) x block 8,
    # their sum 12; LSE: log(1 + exp(blse - lse)) and the two weights' subtractions and exps, broadcast reads (96).
    # Backward: dq += block_dq into fp32 (read e + 4, write 4), dK and dV alike, sent on in fp32. Counted:
    # tests/test_fidelity_terms.py
    "yunchang": MergeBytes(1, 32, 96, 1, 8),
    # NVIDIA TransformerEngine v1.4 (March 2024; NeMo 24.03, the USP paper's Megatron-LM runs, Tables 5-7; v1.2-v1.5
    # alike):
    # AttnFuncWithCP keeps out in the input dtype and corrects it with flash_attn_fwd_out_correction under
    # jit_fuser = torch.compile (torch >= 2), one fused pass: read out_per_step and out, write out (3 e); LSE: that
    # pass reads two fp32 LSEs (8) and flash_attn_fwd_softmax_lse_correction, fused too, reads the fp64 LSE and the
    # step's fp32 one and writes fp64 (20). Backward: dq.add_(dq_) and dkv.add_(dkv_), eager, in the input dtype
    # (read 2 e, write e), and dkv travels in it. Not counted: its zigzag rounds' .contiguous() copies of a K, V or
    # Q half.
    "transformer-engine": MergeBytes(3, 0, 28, 3, 0, carried=0.0),
}
