"""``sp_plan.planner.discover``, the old import path of topology discovery: discovery reads the host, so it lives in
the store and discovery layer, ``sp_plan.profiles.discover``. This package and its submodules (``.host``,
``.calibrate``, ...) are that package and its submodules under the old names."""
import importlib
import sys

from sp_plan.profiles.discover import *  # noqa: F401,F403 - the alias's names
from sp_plan.profiles.discover import __all__  # noqa: F401

for _name in ("build", "calibrate", "checks", "host", "nvml", "report", "specs", "sysfs", "topo"):
    sys.modules[f"{__name__}.{_name}"] = importlib.import_module(f"sp_plan.profiles.discover.{_name}")
