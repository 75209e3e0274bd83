"""The runtime's variant registry: every variant registers itself, no import cycle, a newcomer is one module."""
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from sp_plan.planner.errors import PlanError
from sp_plan.runtime import variants as V
from sp_plan.runtime.attention import attention

ALL = {"ring", "ulysses", "usp", "wallfacer", "tokenring", "tokenring_ring", "metp"}


def test_load_all_registers_every_variant_from_its_own_module():
    assert V.variant_modules() == sorted(V.BUILTIN_MODULES)  # found in the package, not listed in load_all
    reg = V.load_all()
    assert ALL <= set(reg)
    owner = {"ring": "ring", "ulysses": "ulysses", "usp": "usp", "wallfacer": "wallfacer", "tokenring": "tokenring",
             "tokenring_ring": "tokenring", "metp": "metp"}
    for name, mod in owner.items():
        assert reg[name].name == name
        assert reg[name].fn.__module__ == f"sp_plan.runtime.variants.{mod}", name


def _fresh(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


def test_registry_imports_no_variant_and_each_variant_imports_alone():
    out = _fresh("import sys, sp_plan.runtime.variants as V, sp_plan.runtime.attention\n"
                 "print(sorted(m for m in sys.modules if m.startswith('sp_plan.runtime.variants.') and "
                 "m.split('.')[-1] in V.BUILTIN_MODULES), sorted(V.VARIANTS))")
    assert out.strip() == "[] []"
    # each variant module imports on its own (no cycle through the registry) and registers only itself
    out = _fresh("import importlib, sp_plan.runtime.variants as V\n"
                 "for m in V.BUILTIN_MODULES:\n"
                 "    before = set(V.VARIANTS); importlib.import_module('sp_plan.runtime.variants.' + m)\n"
                 "    print(m, sorted(set(V.VARIANTS) - before))")
    got = dict(line.split(" ", 1) for line in out.strip().splitlines())
    assert got == {"ring": "['ring']", "ulysses": "['ulysses']", "usp": "['usp']", "wallfacer": "['wallfacer']",
                   "tokenring": "['tokenring', 'tokenring_ring']", "metp": "['metp']",
                   "allgather": "['allgather']"}


def test_a_new_variant_is_dispatched_by_attention(monkeypatch):
    V.load_all()
    seen = {}

    def doubled(q, k, v, *, groups, ranks, causal, token_layout, scale, backend):
        seen.update(groups=groups, ranks=ranks, causal=causal, token_layout=token_layout, scale=scale, backend=backend)
        return 2 * F.scaled_dot_product_attention(q, k, v)

    monkeypatch.setitem(V.VARIANTS, "doubled", V.Variant("doubled", doubled))
    q = torch.randn(1, 4, 2, 8)
    out = attention(q, q, q, algorithm="doubled", groups=None, causal=True, token_layout="zigzag", scale=0.5,
                    backend="math")
    assert torch.allclose(out, 2 * F.scaled_dot_product_attention(q, q, q))
    assert seen == {"groups": {}, "ranks": {}, "causal": True, "token_layout": "zigzag", "scale": 0.5,
                    "backend": "math"}


def test_unknown_algorithm_lists_the_registered_ones():
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(PlanError, match=r"use one of \['allgather', 'metp', 'ring', 'tokenring', 'tokenring_ring', 'ulysses', 'usp', 'wallfacer'\]"):
        attention(q, q, q, algorithm="nope", groups={})


def test_load_all_lists_the_package_once(monkeypatch):
    """Every attention call asks for the registry: listing the package's folder each time cost a GPU world-1 call
    most of its fixed overhead, so the variant modules are imported once and later calls read no folder."""
    V.load_all()

    def listing_again(*a, **k):
        raise AssertionError("load_all listed the runtime package again")
    monkeypatch.setattr(V.pkgutil, "iter_modules", listing_again)
    assert "ring" in V.load_all()
