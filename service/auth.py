"""Bearer tokens: writes need one, reads too with --private; compared in constant time, never logged."""
from __future__ import annotations

import hmac
from pathlib import Path

from sp_plan.planner.errors import PlanError

ENV_VAR = "SP_PLAN_TOKENS"


def load_tokens(token_file: str | None = None, listed: str | None = None) -> tuple[bytes, ...]:
    """The accepted tokens: one per line of ``token_file`` (blank lines and # comments skipped), else those
    ``listed`` comma-separated (``$SP_PLAN_TOKENS``, as service/settings.py reads it)."""
    if token_file:
        try:
            text = Path(token_file).read_text()
        except OSError as e:
            raise PlanError("token_file", f"cannot read {token_file} ({e.strerror or e})", "pass a readable file") from None
        items = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        if not items:
            raise PlanError("token_file", f"{token_file} holds no token", "write one token per line")
    else:
        items = [t.strip() for t in (listed or "").split(",") if t.strip()]
    return tuple(t.encode() for t in items)


class Unauthorized(PlanError):
    """No bearer token, or not one in the Bearer scheme (HTTP 401)."""

    def __init__(self, problem: str, fix: str):
        super().__init__("Authorization", problem, fix)


class Forbidden(PlanError):
    """A token this service does not accept, or a service that accepts none (HTTP 403)."""

    def __init__(self, problem: str, fix: str):
        super().__init__("Authorization", problem, fix)


def check(header: str | None, tokens: tuple[bytes, ...]) -> None:
    """Raise Unauthorized or Forbidden unless ``header`` is 'Bearer T' with T one of ``tokens`` (hmac.compare_digest
    on every token, so the time does not depend on which one matches or how much of it)."""
    if not tokens:
        raise Forbidden("this service accepts no tokens, so it takes no writes",
                        f"start sp-plan serve with --token-file FILE or ${ENV_VAR}")
    scheme, _, given = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise Unauthorized("a bearer token is required", "send the header 'Authorization: Bearer TOKEN' "
                           "(the CLI reads $SP_PLAN_TOKEN)")
    given_b = given.strip().encode()
    ok = False
    for t in tokens:
        ok |= hmac.compare_digest(given_b, t)
    if not ok:
        raise Forbidden("the token is not accepted", "use a token the service was given (its --token-file or "
                        f"${ENV_VAR})")
