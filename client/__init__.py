"""A client of the planner service (`sp-plan serve`): the same request and response models as the CLI.

    from sp_plan.client import Client
    res = Client("http://planner:8000").plan(cluster="dgx-h100", nodes=2, model="llama3-8b",
                                             workload={"seq_len": "128k"})
    res.winner.save("plan.yaml")

A 4xx answer is raised as the PlanError the service sent (field, problem, fix), so callers print the
same one line as a local run; an unreachable service is a PlanError("server").
"""
from __future__ import annotations

import os
from pathlib import Path

import httpx

from sp_plan.planner.errors import PlanError
from sp_plan.planner.profile import Profile
from sp_plan.pipeline import EstimateRequest, EstimateResponse, PlanRequest, PlanResponse

__all__ = ["Client", "TOKEN_ENV"]
TOKEN_ENV = "SP_PLAN_TOKEN"


class Client:
    """Talks to a planner service at ``url``; ``token`` (a bearer token) is needed for uploads and deletes."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 600.0):
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    @classmethod
    def from_env(cls, url: str) -> "Client":
        """A client with the token in ``$SP_PLAN_TOKEN`` (what the CLI's --server options use)."""
        return cls(url, token=os.environ.get(TOKEN_ENV) or None)

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
        """POST /v1/plan: ranked plans for a PlanRequest (or its fields as keywords)."""
        req = request or PlanRequest(**fields)
        return PlanResponse.model_validate(self._call("POST", "/v1/plan", json=req.model_dump(mode="json")).json())

    def estimate(self, request: EstimateRequest | None = None, **fields) -> EstimateResponse:
        """POST /v1/estimate: one plan priced on a cluster."""
        req = request or EstimateRequest(**fields)
        body = req.model_dump(mode="json", exclude_none=True)
        return EstimateResponse.model_validate(self._call("POST", "/v1/estimate", json=body).json())

    def get_plan(self, id: str, families: bool = False) -> PlanResponse:
        """GET /v1/plans/{id}: a plan the service computed (``families``: with the best layout of each variant)."""
        params = {"families": "true"} if families else None
        return PlanResponse.model_validate(self._call("GET", f"/v1/plans/{id}", params=params).json())

    # ---- profiles
    def profiles(self, fingerprint: str | None = None) -> list[Profile]:
        """GET /v1/profiles: the stored profiles, newest first."""
        params = {"fingerprint": fingerprint} if fingerprint else None
        return [Profile.model_validate(p) for p in self._call("GET", "/v1/profiles", params=params).json()]

    def profile(self, id: str) -> Profile:
        """GET /v1/profiles/{id}."""
        return Profile.model_validate(self._call("GET", f"/v1/profiles/{id}").json())

    def upload_profile(self, profile: Profile | str | Path) -> str:
        """POST /v1/profiles: store a profile (or a profile file); returns its id in the service's store."""
        p = profile if isinstance(profile, Profile) else Profile.load(profile)
        return self._call("POST", "/v1/profiles", json=p.model_dump(mode="json")).json()["id"]

    def delete_profile(self, id: str) -> None:
        """DELETE /v1/profiles/{id}."""
        self._call("DELETE", f"/v1/profiles/{id}")
