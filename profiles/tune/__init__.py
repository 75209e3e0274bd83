from .candidate import run_candidate
from .kernels import kernel_shapes, measure_kernels
from .memory import PeakMemory
