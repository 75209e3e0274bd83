"""A file's lengths are summarised with one bin per length below 8 tokens, then bins whose edges are
floor(8 * 2**(k/8)) tokens (8 per doubling, edges that round to the same token merged), up to one past the longest
length: the same file always records the same histogram, and so draws the same packs."""
from sp_plan.planner.documents import histogram_of


def test_the_edges_of_lengths_one_to_forty():
    h = histogram_of(list(range(1, 41)), "lengths.txt")
    assert h.edges == (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 16, 17, 19, 20, 22, 24, 26, 29, 32, 34, 38, 41)
    assert sum(h.weights) == 40 and h.weights[:7] == (1.0,) * 7 and h.weights[-1] == 3.0  # 38, 39, 40
