"""flash-attn calls get only the keywords the installed version takes; window_size becomes
window_size_left / window_size_right (in that order) where the version splits it."""
from sp_plan.runtime import backends as B


def test_window_size_is_split_for_newer_versions():
    def new(q, k, v, dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap):
        pass
    assert B._fa_kwargs(new, dropout_p=0.0, window_size=(3, 5), alibi_slopes=None) == {
        "dropout_p": 0.0, "window_size_left": 3, "window_size_right": 5}


def test_window_size_is_kept_for_older_versions():
    def old(q, k, v, dropout_p, softmax_scale, causal, window_size, alibi_slopes):
        pass
    assert B._fa_kwargs(old, window_size=(3, 5), softcap=0.0, alibi_slopes=None) == {
        "window_size": (3, 5), "alibi_slopes": None}
