from .candidate import run_candidate
from .isolate import run_candidate_isolated
from .kernels import kernel_shapes, measure_kernels
from .memory import PeakMemory
