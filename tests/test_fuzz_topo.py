"""Fuzzing the `nvidia-smi topo -m` boundary: generated matrices parse to what they say; damaged text is a
PlanError (a file the user gave) or a fallback with a warning (nvidia-smi's own output), never a crash."""
from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from fuzzing import outcome
from sp_plan.planner.discover.host import gather_sources
from sp_plan.planner.discover.topo import LEVELS, TopoMatrix, parse_query_gpu, parse_topo

ALIASES = {"SOC": "SYS", "CPU": "PHB"}


@st.composite
def matrices(draw) -> tuple[str, dict]:
    """(text as nvidia-smi prints it, what it says): GPUs, NICs with a legend or not, cells, NUMA affinity."""
    n, m = draw(st.integers(1, 8)), draw(st.integers(0, 4))
    gpus = [f"GPU{i}" for i in range(n)]
    nic_labels = [f"NIC{i}" for i in range(m)]
    legend = draw(st.booleans())
    real = {lb: (f"mlx5_{i}" if legend else lb) for i, lb in enumerate(nic_labels)}
    labels = gpus + nic_labels
    level = st.sampled_from(list(LEVELS) + list(ALIASES))
    cells = {}
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            c = draw(st.one_of(level, st.integers(1, 18).map(lambda k: f"NV{k}"))) if b in gpus else draw(level)
            cells[(a, b)] = cells[(b, a)] = c
    numa = {g: draw(st.one_of(st.none(), st.integers(0, 7))) for g in gpus}
    sep = draw(st.sampled_from(["\t", "  ", "\t "]))
    color = draw(st.booleans())
    head = sep + sep.join(labels) + sep + "CPU Affinity" + sep + "NUMA Affinity" + sep + "GPU NUMA ID"
    lines = [("\x1b[4m" + head + "\x1b[0m") if color else head]
    for a in labels:
        row = [a] + [" X " if a == b else cells[(a, b)] for b in labels]
        if a in gpus:
            row += ["0-31", "N/A" if numa[a] is None else str(numa[a]), "", "N/A"]
        lines.append(sep.join(row))
    lines += ["", "Legend:", "", "  X    = Self", "  NV#  = Connection traversing a bonded set of # NVLinks"]
    if legend and m:
        lines += ["", "NIC Legend:", ""] + [f"  {lb}: {real[lb]}" for lb in nic_labels]
    said = {"gpus": gpus, "nics": [real[lb] for lb in nic_labels], "numa": numa,
            "cells": {(real.get(a, a), real.get(b, b)): ALIASES.get(c, c) for (a, b), c in cells.items()}}
    return "\n".join(lines) + "\n", said


@given(matrices())
def test_generated_matrices_parse_to_what_they_say(case):
    text, said = case
    t = parse_topo(text)
    assert t.gpus == said["gpus"] and t.nics == said["nics"]
    for (a, b), c in said["cells"].items():
        assert t.cells[(a, b)] == c
    assert {g: t.numa.get(g) for g in t.gpus} == said["numa"]


@st.composite
def damaged(draw) -> str:
    text, _ = draw(matrices())
    lines = text.splitlines()
    how = draw(st.sampled_from(["drop_line", "replace_token", "truncate", "noise", "unicode_digits", "random"]))
    if how == "drop_line" and lines:
        del lines[draw(st.integers(0, len(lines) - 1))]
    elif how == "replace_token":
        i = draw(st.integers(0, len(lines) - 1))
        toks = lines[i].split("\t") or [""]
        toks[draw(st.integers(0, len(toks) - 1))] = draw(st.sampled_from(["", "GPU0", "NV", "NVx", "X", "²", "-1",
                                                                              "GPU99", "NIC0:", "\x00", "CPU"]))
        lines[i] = "\t".join(toks)
    elif how == "truncate":
        return text[:draw(st.integers(0, len(text)))]
    elif how == "noise":
        return text + draw(st.text(max_size=200))
    elif how == "unicode_digits":
        return text.replace("\t0\t", "\t²\t").replace("\t1\t", "\t١\t")
    else:
        return draw(st.text(max_size=300))
    return "\n".join(lines)


@example("GPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-3\t²\n")
@given(damaged())
def test_damaged_matrices_are_a_plan_error_or_a_matrix(text):
    got = outcome(lambda: parse_topo(text, "topo file"))
    if isinstance(got, TopoMatrix):
        assert all(g.startswith("GPU") for g in got.gpus)


@given(damaged())
def test_discovery_falls_back_on_any_nvidia_smi_output(text):
    smi = lambda *args: (text, "")  # noqa: E731 - a driver printing anything at all
    sources, warns = gather_sources("/nonexistent-sysfs", nvml=False, smi=smi)
    assert sources.topo is not None or sources.notes["topo"].startswith("unparsable")


@given(st.text(max_size=300))
def test_query_gpu_csv_never_crashes(text):
    rows = parse_query_gpu(text)
    assert all(isinstance(r["index"], int) and r["memory_bytes"] >= 0 for r in rows)
