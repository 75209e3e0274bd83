"""Bearer tokens: writes need one, reads too with --private; compared in constant time, never logged."""
from __future__ import annotations

import hmac
import os
from pathlib import Path

from sp_plan.planner.errors import PlanError

ENV_VAR = "SP_PLAN_TOKENS"


def load_tokens(token_file: str | None = None) -> tuple[bytes, ...]:
    """The accepted tokens: one per line of ``token_file`` (blank lines and # comments skipped), else
    ``$SP_PLAN_TOKENS`` (comma-separated)."""
    if token_file:
        try:
            text = Path(token_file).read_text()
        except OSError as e:
            raise PlanError("--token-file", f"cannot read {token_file} ({e.strerror or e})", "pass a readable file") from None
        items = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        if not items:
            raise PlanError("--token-file", f"{token_file} holds no token", "write one token per line")
    else:
        items = [t.strip() for t in os.environ.get(ENV_VAR, "").split(",") if t.strip()]
    return tuple(t.encode() for t in items)


class Unauthorized(PlanError):
    """401 (no token) or 403 (a token that is not accepted)."""

    def __init__(self, status: int, problem: str, fix: str):
        super().__init__("Authorization", problem, fix)
        self.status = status


def check(header: str | None, tokens: tuple[bytes, ...]) -> None:
    """Raise Unauthorized unless ``header`` is 'Bearer T' with T one of ``tokens`` (hmac.compare_digest on every
    token, so the time does not depend on which one matches or how much of it)."""
    if not tokens:
        raise Unauthorized(403, "this service accepts no tokens, so it takes no writes",
                           f"start sp-plan serve with --token-file FILE or ${ENV_VAR}")
    scheme, _, given = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise Unauthorized(401, "a bearer token is required", "send the header 'Authorization: Bearer TOKEN' "
                           "(the CLI reads $SP_PLAN_TOKEN)")
    given_b = given.strip().encode()
    ok = False
    for t in tokens:
        ok |= hmac.compare_digest(given_b, t)
    if not ok:
        raise Unauthorized(403, "the token is not accepted", "use a token listed in the service's --token-file")
