"""A backend is unavailable for head dims that are not a multiple it needs (flash, cuDNN: 8) and for explicit
masks when it takes none, so such regions go to a backend that computes them."""
import torch

from sp_plan.runtime import backends as B


def test_head_dim_not_a_multiple_of_8_is_refused_by_the_fused_cuda_kernels():
    for name in ("flash", "cudnn", "flash_attn"):
        why = B.BACKENDS[name].unavailable("cuda", torch.bfloat16, 36)
        assert why == f"{name} takes head dims that are multiples of 8 up to {B.BACKENDS[name].max_head_dim}, not 36"


def test_an_explicit_mask_is_refused_by_backends_without_mask_support():
    for name in ("flash", "cudnn", "flash_attn"):
        assert B.BACKENDS[name].unavailable("cuda", torch.bfloat16, 64, masked=True) == f"{name} takes no explicit mask"
    assert B.available("cuda", torch.bfloat16, 64, masked=True) == ["efficient", "math"]
