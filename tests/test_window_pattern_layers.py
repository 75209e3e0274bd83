"""A local:global window pattern's windowed layers: the count the mask pricing weighs by is the number of layers
the pattern puts a window on, one by one (layer i is windowed where i mod (local + global) < local), including a
last, partial repeat that reaches into its global layers."""
from __future__ import annotations

import pytest

from sp_plan.planner import Workload


@pytest.mark.parametrize("pattern", ["5:1", "1:3", "2:2", "3:5"])
@pytest.mark.parametrize("layers", [1, 4, 7, 8, 13, 62])
def test_windowed_layers_count_the_layers_with_a_window(pattern, layers):
    win = Workload(seq_len=8192, window={"size": 1024, "pattern": pattern}).window
    local, glob = (int(x) for x in pattern.split(":"))
    by_hand = sum(1 for i in range(layers) if i % (local + glob) < local)
    assert win.windowed_layers(layers) == by_hand
    assert sum(win.layer_window(i) is not None for i in range(layers)) == by_hand
