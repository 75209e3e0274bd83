"""`sp_plan.plan` hands its caller the notes `sp-plan plan` prints about the inputs: the workload's (a window that
covers the sequence) and the cluster's (nodes of other hardware, priced like node 0)."""
from __future__ import annotations

import sp_plan
from test_cluster_mixed_nodes import mixed


def test_a_window_over_the_whole_sequence_is_noted():
    ranked = sp_plan.plan("a10-4-pcie", "gpt-3b", {"seq_len": 2048}, top_k=1, window=4096, profile=False)
    assert ranked.notes == ["window 4096 covers the 2048-token sequence: full attention on its layers"]


def test_nodes_of_other_hardware_are_noted():
    ranked = sp_plan.plan(mixed(), "gpt-3b", {"seq_len": 2048}, top_k=1, profile=False)
    assert len(ranked.notes) == 1 and "its nodes are of 2 types" in ranked.notes[0]


def test_plain_inputs_carry_no_notes():
    assert sp_plan.plan("a10-4-pcie", "gpt-3b", {"seq_len": 2048}, top_k=1, profile=False).notes == []
