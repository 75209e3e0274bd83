"""The message sizes links are measured at: the defaults per device kind and the parser of ``16K,1M,64M``."""
from __future__ import annotations

import re

from sp_plan.planner.errors import PlanError

#: sizes `sp-plan profile links` and tune's link step measure by default, per device kind
DEFAULT_SIZES = {"cpu": "16K,128K,1M,4M", "cuda": "1M,8M,64M,256M"}


def parse_sizes(text: str) -> list[int]:
    """``16K,1M,64m,1G`` or plain byte counts -> bytes (binary units)."""
    sizes = []
    for tok in [t.strip() for t in text.split(",") if t.strip()]:
        m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kKmMgG]?)[bB]?", tok)
        if not m:
            raise PlanError("sizes", f"cannot read size {tok!r}", "give sizes like 64K,1M,16M (bytes, binary units)")
        n = int(float(m.group(1)) * {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[m.group(2).lower()])
        if n < 8:
            raise PlanError("sizes", f"size {tok!r} is below 8 bytes", "use sizes of at least 8 bytes")
        sizes.append(n)
    if not sizes:
        raise PlanError("sizes", "no sizes given", "give sizes like 64K,1M,16M")
    return sorted(set(sizes))
