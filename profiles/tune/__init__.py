"""`sp-plan tune`: measure kernels and candidates on the running world (this package), choose, calibrate, store."""
from .candidate import run_candidate
from .isolate import run_candidate_isolated
from .kernels import kernel_shapes, measure_kernels, token_rows
from .memory import PeakMemory

__all__ = ["run_candidate", "run_candidate_isolated", "kernel_shapes", "measure_kernels", "token_rows", "PeakMemory"]
