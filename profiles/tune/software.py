"""The software stack a profile is keyed by (with the cluster's topology fingerprint)."""
from __future__ import annotations

import torch


def software_stack(device: str | None = None) -> dict[str, str]:
    """torch, CUDA, cuDNN and NCCL versions and the attention block backend this rank's device runs."""
    from sp_plan.runtime.kernels import select_backend

    cuda = torch.cuda.is_available() and device != "cpu"
    nccl = ""
    if cuda:
        try:
            nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001 - a build without NCCL
            nccl = ""
    probe = torch.empty(1, 1, 1, 1, device="cuda" if cuda else "cpu",
                        dtype=torch.bfloat16 if cuda else torch.float32)
    return {"torch": torch.__version__.split("+")[0], "cuda": (torch.version.cuda or "") if cuda else "",
            "cudnn": str(torch.backends.cudnn.version() or "") if cuda else "", "nccl": nccl,
            "attention_backend": select_backend(probe)}
