"""``sp_plan.runtime.probe``, kept for old imports: the torchrun half of discovery (gathering host reports, measuring
links) reads the host, so it lives in the store and discovery layer as ``sp_plan.profiles.discover.probe``. This name
is that very module (the same object, so a patch through either name reaches both), not a copy.

The runtime layer sits below profiles and none of its code uses this alias, so the module is named by string: the
layers contract in pyproject.toml holds for the runtime, and only code that still says the old name loads discovery.
"""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("sp_plan.profiles.discover.probe")
