"""Profile: what `sp-plan tune` learned about one cluster and software stack (the file and store document).

A profile describes the cluster, not one workload: fitted ``Params`` (planner/params.py) plus the
measurements they came from and how well the model predicted them before and after. It is keyed by
the cluster's topology fingerprint (``Cluster.topology_fingerprint``: device kinds and counts, link
graph, NIC rates; not the calibrated capacities) and the software stack.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .errors import PlanError, of_type
from .params import Params
from .plausible import check_finite
from .yamlio import check_schema_version, dump_data, load_yaml_model

PROFILE_SCHEMA_VERSION = 1
#: stack fields that must agree for a profile to apply (software_stack() in runtime/stack.py fills them)
STACK_KEYS = ("torch", "cuda", "cudnn", "nccl", "attention_backend")


@dataclass
class KernelSample:
    """One timed local kernel (tune's kernel step): attention block forward/backward or a GEMM.

    flops: attention forward 4 b s^2 h d (halved when causal), backward 2.5x that; GEMM 2 m n k.
    Efficiency = flops / (seconds x the device's peak FLOP/s for the model's dtype)."""

    kind: Literal["attention_fwd", "attention_bwd", "matmul"]
    size: int  # attention: block length (query block = key block); matmul: rows (tokens)
    heads: int
    head_dim: int
    causal: bool
    flops: float
    seconds: float
    dtype: str = "float32"
    batch: int = 1
    backend: str = ""
    gemm: tuple[int, int, int] | None = None  # matmul: (m, n, k) = (rows, output features, input features)
    alone: bool | None = None  # True: timed while every other rank waited; False: by every rank at once through
    # one shared window (timing.time_window, the reference of Params.solo_speedup); None: the kernel step's sweep


class MeasuredCandidate(BaseModel):
    """One candidate tune ran: its plan, what the model said before and after calibration, what ran."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    summary: str
    plan: dict = Field(description="the whole Plan document (with model and workload) that ran")
    model: str = ""
    seq_len: int = 0
    batch: int = 1
    status: Literal["ok", "oom", "error", "timeout", "dead_rank"] = "ok"
    reason: str = ""
    rank: int | None = None
    predicted_before_s: float | None = Field(default=None, ge=0)
    predicted_after_s: float | None = Field(default=None, ge=0)
    measured_s: float | None = Field(default=None, gt=0)
    predicted_memory_before: float | None = None
    predicted_memory_after: float | None = None
    measured_memory: float | None = Field(default=None, ge=0)
    detail: dict = {}

    @model_validator(mode="after")
    def _plausible(self):
        check_finite(self.detail, "candidates.detail")
        check_finite(self.plan, "candidates.plan")
        return self


def created_utc(text: str) -> str:
    """A profile's ``created_at`` (ISO 8601: a date, or a time with or without its offset; none is UTC) as the UTC
    time ``YYYY-MM-DDTHH:MM:SS+00:00``, whose text order is time order (the store's newest profile)."""
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise PlanError("profile.created_at", f"{text!r} is not an ISO 8601 time",
                        "write it like 2026-11-23T07:54:36+00:00, or leave it out (the store stamps it)") from None
    t = t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)
    return t.astimezone(timezone.utc).isoformat(timespec="seconds")


class Profile(BaseModel):
    """A calibrated parameter set for one cluster and software stack, with its evidence."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    schema_version: int = PROFILE_SCHEMA_VERSION
    id: str | None = None
    cluster: str = ""
    cluster_fingerprint: str
    stack: dict[str, str] = {}
    created_at: str = ""
    params: Params = Params()
    fitted: list[str] = Field(default_factory=list, description="which parameters were fitted, in words")
    workloads: list[dict] = Field(default_factory=list, description="model and workload each tune ran")
    candidates: list[MeasuredCandidate] = []
    loo_error_before: float | None = None
    loo_error_after: float | None = None
    loo_memory_error_before: float | None = None
    loo_memory_error_after: float | None = None
    measurements: dict = Field(default_factory=dict, description="raw link and kernel samples")

    @model_validator(mode="before")
    @classmethod
    def _version(cls, data):
        check_schema_version(data, PROFILE_SCHEMA_VERSION, "profile")
        return data

    @model_validator(mode="after")
    def _plausible(self):
        if self.created_at:
            created_utc(self.created_at)
        check_finite(self.measurements, "profile.measurements")
        check_finite(self.workloads, "profile.workloads")
        for name in ("loo_error_before", "loo_error_after", "loo_memory_error_before", "loo_memory_error_after"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise PlanError(f"profile.{name}", f"a negative error ({v})", "re-run `sp-plan tune`")
        return self

    def save(self, path: str | Path) -> None:
        dump_data(self.model_dump(mode="json", exclude_none=True), path, sealed=True)

    @classmethod
    def load(cls, path: str | Path) -> "Profile":
        return load_yaml_model(cls, path, "profile")

    def line(self) -> str:
        """One line for `plan`: id, when tuned, candidates measured, leave-one-out error."""
        ok = sum(1 for c in self.candidates if c.status == "ok")
        loo = f"{self.loo_error_after:.1%}" if self.loo_error_after is not None else "n/a"
        return (f"profile {self.id or '(file)'} tuned {self.created_at or '?'}, {ok} candidate(s) measured, "
                f"leave-one-out error {loo}")


#: how to make each model a pure planner call takes, where no pipeline call takes names for it
LOADERS = {"cluster": "sp_plan.load_cluster(name or file)", "model": "sp_plan.load_model(name or file)",
           "workload": "sp_plan.Workload(seq_len=..., batch=...)"}


def pure_inputs(cluster, model, workload, entry: str | None) -> None:
    """A pure planner call takes the models themselves; a name or a mapping (which ``entry``, the pipeline's call,
    reads; None: there is none, so the loader is named) is a PlanError naming the argument, not an AttributeError
    from deep inside."""
    from .cluster import Cluster  # noqa: PLC0415 - cluster and model import this module's neighbours
    from .model import ModelSpec, Workload  # noqa: PLC0415

    for name, value, cls in (("cluster", cluster, Cluster), ("model", model, ModelSpec),
                             ("workload", workload, Workload)):
        of_type(name, value, cls, f"a {cls.__name__}, or call {entry}, which takes names and mappings" if entry
                else LOADERS[name])


def pure_params(profile, params: Params | None, entry: str) -> Params | None:
    """What a pure planner call prices with: ``params``, else a loaded ``profile``'s, else None (the uncalibrated
    engine); a profile to look up (an id, a file, False) is refused, naming ``entry``, the pipeline call that looks
    it up."""
    if profile is not None and not isinstance(profile, Profile):
        raise PlanError("profile", f"the planner prices with params= and a loaded Profile, not {profile!r} to look up",
                        f"call {entry}, which looks profiles up (profile=False: the presets' defaults), or pass "
                        "params=")
    return params if params is not None else (profile.params if profile is not None else None)
