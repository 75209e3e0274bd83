"""A client of the planner service (`sp-plan serve`): the same request and response models as the CLI.

    from sp_plan.client import Client
    res = Client("http://planner:8000").plan(cluster="dgx-h100", nodes=2, model="llama3-8b",
                                             workload={"seq_len": "128k"})
    res.winner.save("plan.yaml")

A 4xx answer is raised as the PlanError the service sent (field, problem, fix), so callers print the
same one line as a local run; a malformed URL or an unreachable service is a PlanError("server"), a token that
cannot be sent in a header a PlanError on the token.
"""
from __future__ import annotations

import math
import numbers
import os
from pathlib import Path
from urllib.parse import quote

import httpx

from sp_plan.planner.errors import PlanError
from sp_plan.planner.profile import Profile
from sp_plan.pipeline import EstimateRequest, EstimateResponse, PlanRequest, PlanResponse, as_model

__all__ = ["Client", "TOKEN_ENV"]
TOKEN_ENV = "SP_PLAN_TOKEN"


class Client:
    """Talks to a planner service at ``url``; ``token`` (a bearer token) is needed for uploads and deletes."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 600.0):
        self.url = checked_url(url).rstrip("/")
        headers = {"Authorization": f"Bearer {checked_token(token, 'token')}"} if token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=checked_timeout(timeout),
                                  follow_redirects=False)

    @classmethod
    def from_env(cls, url: str) -> "Client":
        """A client with the token in ``$SP_PLAN_TOKEN`` (what the CLI's --server options use)."""
        token = os.environ.get(TOKEN_ENV) or None
        return cls(url, token=token and checked_token(token, TOKEN_ENV))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, path: str, **kw) -> httpx.Response:
        try:
            r = self._http.request(method, path, **kw)
        except httpx.HTTPError as e:
            raise PlanError("server", f"cannot reach the planner service at {self.url} ({type(e).__name__}: {e})",
                            "start it with `sp-plan serve` or check the URL") from None
        if 300 <= r.status_code < 400:  # never followed: a redirect is no answer to this request
            raise PlanError("server", f"{self.url}{path} answered {r.status_code}, a redirect to "
                            f"{r.headers.get('location', '(none)')!r}, not an answer",
                            "check the URL (it names the service itself, not a proxy in front of it)")
        if r.status_code >= 400:
            try:
                e = r.json()["error"]
                raise PlanError(e["field"], e["problem"], e["fix"])
            except (ValueError, KeyError, TypeError):
                raise PlanError("server", f"{self.url}{path} answered {r.status_code} {r.text[:200]!r}",
                                "check the service's log") from None
        return r

    # ---- planning
    def plan(self, request: PlanRequest | None = None, **fields) -> PlanResponse:
        """POST /v1/plan: ranked plans for a PlanRequest or its mapping (or its fields as keywords)."""
        req = _request(PlanRequest, request, fields)
        return PlanResponse.model_validate(self._call("POST", "/v1/plan", json=req.model_dump(mode="json")).json())

    def estimate(self, request: EstimateRequest | None = None, **fields) -> EstimateResponse:
        """POST /v1/estimate: one plan priced on a cluster, for an EstimateRequest or its mapping (or its fields as
        keywords)."""
        req = _request(EstimateRequest, request, fields)
        body = req.model_dump(mode="json", exclude_none=True)
        return EstimateResponse.model_validate(self._call("POST", "/v1/estimate", json=body).json())

    def get_plan(self, id: str, families: bool = False) -> PlanResponse:
        """GET /v1/plans/{id}: a plan the service computed (``families``: with the best layout of each variant)."""
        params = {"families": "true"} if families else None
        return PlanResponse.model_validate(self._call("GET", f"/v1/plans/{segment(id, 'plan')}", params=params).json())

    # ---- profiles
    def profiles(self, fingerprint: str | None = None) -> list[Profile]:
        """GET /v1/profiles: the stored profiles, newest first."""
        params = {"fingerprint": fingerprint} if fingerprint is not None else None
        return [Profile.model_validate(p) for p in self._call("GET", "/v1/profiles", params=params).json()]

    def profile(self, id: str) -> Profile:
        """GET /v1/profiles/{id}."""
        return Profile.model_validate(self._call("GET", f"/v1/profiles/{segment(id, 'profile')}").json())

    def upload_profile(self, profile: Profile | str | Path) -> str:
        """POST /v1/profiles: store a profile (a Profile, its mapping or a profile file); returns its id in the
        service's store."""
        if isinstance(profile, (str, os.PathLike)):
            profile = Profile.load(profile)
        p = as_model(Profile, profile, "profile", "a Profile, its mapping or a profile file's path")
        return self._call("POST", "/v1/profiles", json=p.model_dump(mode="json")).json()["id"]

    def delete_profile(self, id: str) -> None:
        """DELETE /v1/profiles/{id}."""
        self._call("DELETE", f"/v1/profiles/{segment(id, 'profile')}")


def _request(cls, request, fields: dict):
    """The request a call sends: ``request`` (a ``cls`` or its mapping) or ``fields``, never both."""
    if request is None:
        return cls(**fields)
    if fields:  # one would silently win over the other
        raise PlanError("request", f"both a request and its fields ({', '.join(sorted(fields))}) given",
                        "pass the request or its fields as keywords, not both")
    return as_model(cls, request, "request", f"a {cls.__name__}, a mapping of its fields, or the fields as keywords")


def checked_timeout(timeout) -> float | None:
    """``timeout`` where it is a number of seconds above 0 (None: no limit), else PlanError("timeout"): httpx takes
    any, and a request would fail at once or never."""
    ok = timeout is None or (isinstance(timeout, numbers.Real) and not isinstance(timeout, bool)
                             and not math.isnan(timeout) and timeout > 0)
    if not ok:
        raise PlanError("timeout", f"must be a number of seconds above 0, got {timeout!r}",
                        "pass timeout=600 (seconds; None waits without limit)")
    return timeout


def segment(id: str, field: str) -> str:
    """``id`` as one percent-encoded URL path segment, else PlanError(field): an id that is empty, holds '/', '\\',
    '?', '#', '..' or a control character would address another resource (httpx folds '..' segments away, so
    ``nope/../victim`` is ``victim``), not one that is stored under it."""
    fix = ("pass an id as GET /v1/profiles lists it (a unique prefix of 4+ characters works)" if field == "profile"
           else "pass the id a POST /v1/plan answered")
    if not isinstance(id, str) or not id:
        raise PlanError(field, f"{id!r} is not a {field} id (an empty or missing id names no {field})", fix)
    bad = next((c for c in id if c in "/\\?#" or not c.isprintable()), None)
    if bad is not None or ".." in id:
        what = f"holds {bad!r}" if bad is not None else "holds '..'"
        raise PlanError(field, f"{id!r} is not a {field} id: it {what}, which no stored id does", fix)
    return quote(id, safe="")


def checked_url(url: str) -> str:
    """``url`` where it is an http(s) URL with a host and a port in 1..65535, else PlanError("server"): checked
    before any request, so a typo is one line, not httpx's InvalidURL or a lookup of a host that cannot exist."""
    fix = "pass a URL like http://HOST:8000 (an IPv6 host in brackets: http://[::1]:8000)"
    if not isinstance(url, str):
        raise PlanError("server", f"{type(url).__name__} is no URL", fix)
    url = url.strip()  # a pasted URL's surrounding blanks are no part of it
    try:
        u = httpx.URL(url)
        port = u.port  # a port out of range parses; a socket refuses it later with a misleading error
    except (httpx.InvalidURL, ValueError, TypeError) as e:
        raise PlanError("server", f"{url!r} is not a valid URL ({e})", fix) from None
    if u.scheme not in ("http", "https"):
        raise PlanError("server", f"{url!r} is not an http:// or https:// URL", fix)
    if not u.host or " " in url:
        raise PlanError("server", f"{url!r} names no host" if not u.host else f"{url!r} holds a space", fix)
    if port is not None and not 1 <= port <= 65535:
        raise PlanError("server", f"{url!r} has port {port}, outside 1..65535", fix)
    return url


def checked_token(token: str, field: str) -> str:
    """``token`` where an HTTP header can carry it (printable ASCII), else PlanError(field): a pasted non-ASCII
    character (a non-breaking space, a typographic quote) fails here, not as a UnicodeEncodeError in httpx."""
    bad = next((i for i, c in enumerate(token) if not (c.isascii() and c.isprintable())), None)
    if bad is not None:
        raise PlanError(field, f"the token holds {token[bad]!r} (U+{ord(token[bad]):04X}) at character {bad + 1}, "
                        "which an HTTP header cannot carry", "a token is ASCII; copy it again")
    return token
