"""One algorithm registry without import cycles: the registry imports no algorithm, each algorithm
module registers itself, and the schedule and memory modules read the registry without late imports."""
import ast
from pathlib import Path

import pytest

import sp_plan.planner as planner
from sp_plan.planner import Estimator, ModelSpec, Workload
from sp_plan.planner.algorithms import ALGORITHMS, Algorithm, register
from sp_plan.planner.candidate import Candidate
from sp_plan.profiles import load_cluster

PLANNER = Path(planner.__file__).parent
ALGORITHM_MODULES = {"usp", "metp", "tokenring", "wallfacer", "allgather", "schedules", "memory", "estimate", "search"}


def runtime_imports(path: Path) -> tuple[set[str], set[str]]:
    """(planner modules imported at module level outside TYPE_CHECKING, those imported inside functions)."""
    tree = ast.parse(path.read_text())
    top, late = set(), set()

    def names(node):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            return {node.module} if node.module else {a.name for a in node.names}
        return set()

    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        top |= names(node)
        for sub in ast.walk(node):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and sub is not node:
                late |= names(sub)
    return top, late


def test_the_registry_imports_no_algorithm():
    top, late = runtime_imports(PLANNER / "algorithms.py")
    assert not (top | late) & ALGORITHM_MODULES


@pytest.mark.parametrize("module", ["schedules", "memory", "estimate"])
def test_schedules_and_memory_read_the_registry_without_late_imports(module):
    top, late = runtime_imports(PLANNER / f"{module}.py")
    assert "algorithms" in top and "algorithms" not in late


def test_every_algorithm_module_registers_itself_in_a_stable_order():
    assert list(ALGORITHMS) == ["ring", "ulysses", "usp", "metp", "tokenring", "tokenring_ring", "wallfacer",
                                "allgather"]
    for name, module in (("ring", "usp"), ("usp", "usp"), ("metp", "metp"), ("tokenring_ring", "tokenring"),
                         ("wallfacer", "wallfacer"), ("allgather", "allgather")):
        assert ALGORITHMS[name].steps.__module__ == f"sp_plan.planner.{module}"


def test_a_new_algorithm_is_one_registration():
    """A made-up algorithm (Ring's schedule at twice the compute) priced by the engine with nothing else changed."""
    from sp_plan.planner.schedules import Compute, Step
    from sp_plan.planner.usp import ring_steps, usp_buffer_bytes

    def slow_ring(c, backward):
        return [Step(tuple(Compute(p.name, 2 * p.flops, p.kind, p.block) if isinstance(p, Compute) else p
                           for p in st.phases), st.repeat, st.overlap) for st in ring_steps(c, backward)]

    register(Algorithm("slow_ring", slow_ring, usp_buffer_bytes))
    try:
        est = Estimator(load_cluster("dgx-h100"), ModelSpec(layers=2, hidden=1024, heads=16, vocab=0),
                        Workload(seq_len="16k"))
        base = Candidate("ring", ring=8, order=("ring",), token_layout="zigzag")
        slow = Candidate("slow_ring", ring=8, order=("ring",), token_layout="zigzag")
        est.check(slow)
        assert est.evaluate(slow).step_time_s > est.evaluate(base).step_time_s
    finally:
        ALGORITHMS.pop("slow_ring")
