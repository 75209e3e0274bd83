"""SP_PLAN_ATTN_BACKEND is read with surrounding whitespace ignored; whitespace alone means measure."""
from sp_plan.runtime import choice as C


def test_whitespace_around_the_backend_name_is_ignored():
    assert C.BackendChoice.from_env({C.ENV: " math\n"}).override == "math"
    assert C.BackendChoice.from_env({C.ENV: "  "}).override is None
