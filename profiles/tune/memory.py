"""Peak memory of a region: CUDA's allocator counters on GPU, a storage-tracking dispatch mode on CPU.

``PeakMemory`` counts the bytes of every tensor storage that is alive: those registered with
``track`` (parameters, gradients, optimizer state that existed before the region) plus every
storage an operator allocates inside ``with tracker:``; a weakref finalizer subtracts a storage
when it dies. Views, in-place and ``out=`` results alias an input and are not counted again.
Wrapper subclasses (DTensor, FSDP2's parameters) are unwrapped to their local tensors.
"""
from __future__ import annotations

import threading
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

CPU_METHOD = ("live tensor storages (TorchDispatchMode + weakref finalizers, sp_plan.profiles.tune.memory."
              "PeakMemory): parameters, gradients and optimizer state plus every storage allocated in the step")
CUDA_METHOD = "torch.cuda.max_memory_allocated after reset_peak_memory_stats"


def plain_tensors(x):
    """The plain tensors under ``x`` (a tensor subclass such as DTensor is flattened to its inner tensors)."""
    if not isinstance(x, torch.Tensor):
        return
    if type(x) is not torch.Tensor and hasattr(x, "__tensor_flatten__"):
        names, _ = x.__tensor_flatten__()
        for n in names:
            yield from plain_tensors(getattr(x, n))
    else:
        yield x


class PeakMemory(TorchDispatchMode):
    """High-water mark of live tensor bytes on CPU (module docstring): ``live``, ``peak``, ``reset_peak()``."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: dict[int, int] = {}  # id of a live storage -> bytes
        self._lock = threading.RLock()  # a finalizer may run while this thread holds it

    def _add(self, t: torch.Tensor) -> None:
        if t.device.type == "meta":
            return
        st = t.untyped_storage()
        key = id(st)
        with self._lock:
            if key in self._seen:
                return
            n = st.nbytes()
            self._seen[key] = n
            self.live += n
            self.peak = max(self.peak, self.live)
        weakref.finalize(st, self._drop, key)

    def _drop(self, key: int) -> None:
        with self._lock:
            self.live -= self._seen.pop(key, 0)

    def track(self, *objs) -> None:
        """Count tensors that already exist (modules' parameters and gradients, optimizers' state, tensors)."""
        for obj in objs:
            if isinstance(obj, torch.nn.Module):
                for p in obj.parameters():
                    self.track(p, p.grad)
                for b in obj.buffers():
                    self.track(b)
            elif isinstance(obj, torch.optim.Optimizer):
                self.track(*[v for s in obj.state.values() for v in s.values()])
            elif isinstance(obj, torch.Tensor):
                for t in plain_tensors(obj):
                    self._add(t)

    def seen(self) -> dict[int, int]:
        """The live storages counted: id -> bytes (a copy)."""
        with self._lock:
            return dict(self._seen)

    def reset_peak(self) -> None:
        self.peak = self.live

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {t.untyped_storage().data_ptr() for a in tree_leaves((args, kwargs)) for t in plain_tensors(a)
                  if t.device.type != "meta"}
        for o in tree_leaves(out):
            for t in plain_tensors(o):
                if t.device.type != "meta" and t.untyped_storage().data_ptr() not in inputs:
                    self._add(t)
        return out
