"""Plan: the layout a user runs (algorithm, degrees, mesh order, token layout) and its predictions.

A Plan can be written by hand with only algorithm, degrees, order and token layout; the search
fills in the cluster fingerprint, model, workload and the predictions. A plan stores the mesh, not its expansion:
every group's rank list follows from the degrees and the mesh order (planner/layout.py), so no file or response
carries them (``Plan.with_groups`` derives them for a caller who wants them).
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from .errors import PlanError
from .layout import DIMENSIONS, Layout, check_degrees, check_team, world_size
from .model import ModelSpec, Workload
from .stages import check_stage_layers, check_virtual_stages, stage_list
from .yamlio import check_schema_version, dump_data, load_yaml_model

PLAN_SCHEMA_VERSION = 1
#: more ranks than any cluster has: a typo in the degrees, refused before any rank list is built
MAX_WORLD = 2**20
ALGORITHMS = ("ring", "ulysses", "usp", "wallfacer", "tokenring", "tokenring_ring", "metp", "allgather")
#: algorithms that cut the ring into teams (degrees["team"])
TEAM_ALGORITHMS = ("wallfacer", "tokenring_ring")
#: algorithms that read ``placement``: WallFacer places its teams inside the ring (eq. 8); TokenRing x Ring's teams
#: are always consecutive ring positions (runtime/variants/tokenring.py)
PLACED_ALGORITHMS = ("wallfacer",)
CHECKPOINTING = ("none", "full", "attention_boundary")


def order_text(order, degrees: dict) -> str:
    """A mesh order as plans print it: its dimensions of degree > 1, innermost first, joined by '<' ('' for none)."""
    return "<".join(o for o in order if degrees.get(o, 1) > 1)


def local_kv_heads(heads: int, kv_heads: int, tp: int, ulysses: int) -> int:
    """KV heads one rank attends in a context group (what all-gather gathers and ``kv_chunks`` divides): the model's
    over tp (Megatron: one when fewer), then split over Ulysses as its all-to-all splits them
    (runtime/variants/ulysses.kv_split: evenly; one, replicated, where U is a multiple; else one per query head)."""
    q, kv = heads // tp, max(kv_heads // tp, 1)
    if kv % ulysses == 0:
        return kv // ulysses
    return 1 if ulysses % kv == 0 else q // ulysses


def check_kv_chunks_algorithm(kv_chunks: int, algorithm: str) -> None:
    """Chunks of KV heads over 1 belong to all-gather's gather: a PlanError for any other algorithm."""
    if kv_chunks != 1 and algorithm != "allgather":
        raise PlanError("kv_chunks", f"kv_chunks chunks all-gather's gather of K, V; {algorithm} gathers none",
                        "drop kv_chunks, or use algorithm allgather")


def _group_difference(name: str, lists: list[list[int]], made: list[list[int]]) -> str | None:
    """How a file's rank lists of dimension ``name`` differ from the layout's, compared as sets of rank sets: a list
    that is no group, a group listed twice or one missing (None: the same groups)."""
    want = {tuple(sorted(g)) for g in made}
    seen: set[tuple[int, ...]] = set()
    for g in lists:
        key = tuple(sorted(g))
        if key not in want:
            return f"{g} is no {name} group"
        if key in seen:
            return f"{g} is listed twice"
        seen.add(key)
    missing = next((g for g in made if tuple(sorted(g)) not in seen), None)
    return None if missing is None else f"{missing} is missing"


def one_placement_problem(token_layout: str, work: Workload | None) -> str | None:
    """Why a plan's token layout cannot serve ``work``'s layers, or None: a model's layers share one placement of
    the tokens, and ``balanced`` places them by one mask's work, so it cannot serve layers that mix windows
    (runtime/placement.py)."""
    if token_layout != "balanced" or work is None or not work.mixes_windows:
        return None
    return (f"balanced places packed documents by one mask's work, and these layers mix windows (window "
            f"{work.window.size} on {work.window.pattern} layers), which share one placement")


class PhaseCost(BaseModel):
    """One line of a prediction's breakdown."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    name: str
    kind: Literal["compute", "communication", "bubble"]
    group: str | None = None
    bytes_per_rank: float = 0.0
    seconds: float
    exposed_seconds: float


class Prediction(BaseModel):
    """What the engine predicts for a plan: time, throughput, memory and the per-phase breakdown."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    step_time_s: float = Field(gt=0)
    tokens_per_s: float = Field(ge=0)
    mfu: float = Field(ge=0, description="model FLOPs over peak: attention counted as the mask leaves it")
    mfu_causal: float | None = Field(default=None, ge=0, description="MFU with full causal attention FLOPs, as "
                                     "papers count it (Llama 3's): set where documents or a window cut the mask")
    peak_memory_bytes: float = Field(ge=0)
    memory_capacity_bytes: float = Field(default=0.0, ge=0)
    memory: dict[str, float] = {}
    breakdown: list[PhaseCost] = []

    @property
    def fits(self) -> bool:
        return self.memory_capacity_bytes <= 0 or self.peak_memory_bytes <= self.memory_capacity_bytes


class Measured(BaseModel):
    """What `sp-plan tune` measured for a plan on the real cluster (beside the predictions)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    step_time_s: float = Field(gt=0)
    peak_memory_bytes: float = Field(ge=0)
    profile: str | None = Field(default=None, description="id of the profile whose tune measured it")
    measured_at: str = ""
    how: str = Field(default="", description="layers run and scaled, memory method, fallbacks")


class Plan(BaseModel):
    """A sequence-parallel layout: algorithm, degrees and mesh order (docs/reference/file-formats.md)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    schema_version: int = PLAN_SCHEMA_VERSION
    algorithm: Literal["ring", "ulysses", "usp", "wallfacer", "tokenring", "tokenring_ring", "metp", "allgather"]
    degrees: dict[str, StrictInt]  # a count: true or "4" in a file is a typo, not 1 or 4
    order: list[str] = Field(default_factory=list, description="mesh dimensions, innermost (fastest rank) first")
    token_layout: Literal["contiguous", "zigzag", "striped", "balanced"] = "contiguous"
    zero_stage: int = Field(default=0, ge=0, le=3)
    checkpointing: Literal["none", "full", "attention_boundary"] = "none"
    micro_batch_size: int = Field(default=1, ge=1, description="sequences per micro-batch (per data-parallel rank)")
    stage_layers: list[int] | None = Field(
        default=None, description="layers on each pipeline stage, first to last (pp entries summing to the model's "
                                  "layers); absent: an even split")
    virtual_stages: int | None = Field(
        default=None, ge=1, description="model chunks on each pipeline rank (interleaved 1F1B, Narayanan et al. "
                                        "2021 §2.2.2): each stage's layers split into this many equal chunks; "
                                        "absent or 1: plain 1F1B")
    kv_chunks: int | None = Field(
        default=None, description="allgather: K, V gathered in this many chunks of KV heads, each chunk's gather "
                                  "beside the previous chunk's attention (ring-flash-attention's llama3 variant); "
                                  "it divides the KV heads on a rank (``local_kv_heads``); absent or 1: one "
                                  "gather, exposed")
    placement: Literal["collective_intra", "p2p_intra"] | None = None
    cluster: str | None = Field(default=None, description="name of the cluster the plan was made for")
    cluster_fingerprint: str | None = None
    model: ModelSpec | None = None
    workload: Workload | None = None
    groups: dict[str, list[list[int]]] = Field(
        default_factory=dict, exclude=True,
        description="every group's rank lists, by dimension: never written (derived from degrees and order, "
                    "Plan.with_groups()); an older file's are read and must be the layout's, each "
                    "dimension as a set of rank sets")
    predicted: Prediction | None = None
    measured: Measured | None = None
    profile: str | None = Field(default=None, description="the calibration profile that priced the prediction: "
                                "its id, or \"file\" for one without an id; absent: uncalibrated")

    @model_validator(mode="before")
    @classmethod
    def _version(cls, data):
        check_schema_version(data, PLAN_SCHEMA_VERSION, "plan")
        return data

    @field_validator("model", mode="before")
    @classmethod
    def _model(cls, v):
        """A model preset's name needs its definition, which the application looks up (as ``documents``' names)."""
        if isinstance(v, str):
            raise PlanError("plan.model", f"{v!r} names a model preset, and a Plan takes the model's fields",
                            "give the model's fields, or name the preset where sp-plan looks presets up: the CLI, "
                            "sp_plan.profiles.plans.load_plan(path) (whose Plan init() takes) or a request's model")
        return v

    @model_validator(mode="after")
    def _check(self):
        for n in DIMENSIONS:
            self.degrees.setdefault(n, 1)
        if not self.order:
            self.order = [n for n in ("tp", "ulysses", "ring", "dp", "pp") if self.degrees.get(n, 1) > 1] or ["dp"]
        check_degrees(self.degrees, self.order)
        a, u, r = self.algorithm, self.degrees["ulysses"], self.degrees["ring"]
        if a == "ring" and u != 1:  # allgather with ulysses > 1 is the all-gather x Ulysses hybrid
            raise PlanError("degrees.ulysses", f"algorithm {a} needs ulysses 1, got {u}",
                            "use algorithm usp (or allgather) for ulysses x ring")
        if a == "ulysses" and r != 1:
            raise PlanError("degrees.ring", f"algorithm ulysses needs ring 1, got {r}", "use algorithm usp for ulysses x ring")
        if self.degrees.get("team", 1) > 1 and a not in TEAM_ALGORITHMS:
            raise PlanError("degrees.team", f"team {self.degrees['team']} is WallFacer's; {a} has no teams", "set team to 1")
        if self.placement is not None and a not in PLACED_ALGORITHMS:
            raise PlanError("placement", f"{a} reads no placement; {' and '.join(PLACED_ALGORITHMS)} alone places "
                            "its teams", f"drop placement, or use algorithm {PLACED_ALGORITHMS[0]}")
        # teams divide the ring; WallFacer's C^2 | ring, placement or none, is its own check's (check_algorithm)
        check_team(r, self.degrees["team"], self.placement, wallfacer=False)
        if self.stage_layers is not None:
            check_stage_layers(self.stage_layers, self.degrees["pp"], self.model.layers if self.model else None)
        if self.virtual_stages == 1:
            self.virtual_stages = None  # plain 1F1B, written as before: absent
        if self.virtual_stages is not None:
            check_virtual_stages(self.virtual_stages, self.degrees["pp"], self.model.layers if self.model else None,
                                 self.stage_layers)
        self._check_kv_chunks()
        if self.world_size > MAX_WORLD:
            raise PlanError("degrees", f"{self.world_size:,} ranks is more than any cluster has (at most {MAX_WORLD:,})",
                            "check the degrees")
        self.check_algorithm()
        if self.groups:
            self.groups = self._checked_groups()
        if self.token_layout == "balanced" and (self.workload is None or self.workload.documents is None):
            raise PlanError("token_layout", "balanced assigns packed documents to ranks by their work, and the "
                            "workload has no documents", "use zigzag, or give the workload documents")
        if a == "ulysses" and self.token_layout != "contiguous":
            raise PlanError("token_layout", "ulysses attends the whole sequence after its all-to-all",
                            "use token_layout contiguous with algorithm ulysses")
        return self

    def _check_kv_chunks(self) -> None:
        """kv_chunks: all-gather's, at least 1, dividing the KV heads each rank attends; 1 is written as absent."""
        n = self.kv_chunks
        if n is None:
            return
        if n < 1:
            raise PlanError("kv_chunks", f"{n} chunks of KV heads is fewer than one", "use 1 (one gather) or more")
        if n == 1:
            self.kv_chunks = None  # one gather, written as before: absent
            return
        check_kv_chunks_algorithm(n, self.algorithm)
        if self.model is not None:
            d = self.degrees
            local = local_kv_heads(self.model.heads, self.model.kv_heads, d["tp"], d["ulysses"])
            if local % n:
                fits = [k for k in range(1, local + 1) if local % k == 0]
                raise PlanError("kv_chunks", f"{n} chunks do not split the {local} KV heads a rank attends "
                                f"({self.model.kv_heads} KV heads over tp {d['tp']} x ulysses {d['ulysses']})",
                                f"use one of {fits}")

    def _checked_groups(self) -> dict[str, list[list[int]]]:
        """An older file's ``groups`` checked against the layout's, each dimension as a set of rank sets (a process
        group is its members: ``init`` builds every group from the mesh, its ranks sorted, never from the file);
        the layout's lists, as ``with_groups`` gives them."""
        made = self.layout().all_groups()
        drop = "drop groups (sp-plan derives them from degrees and order)"
        for name, lists in self.groups.items():
            if name not in made:
                raise PlanError(f"groups.{name}", f"the degrees and order make no {name} groups (they make "
                                f"{', '.join(made)})", drop)
            what = _group_difference(name, lists, made[name])
            if what is None:
                continue
            shown = " ".join(map(str, made[name][:4])) + (" ..." if len(made[name]) > 4 else "")
            raise PlanError(f"groups.{name}", f"{what} (degrees {self.degree_text()} and order "
                            f"[{', '.join(self.order)}] make {shown})", f"{drop}, or fix groups.{name}")
        return made

    def degree_text(self) -> str:
        """The degrees above 1, e.g. 'ulysses=8 x ring=2'."""
        return " x ".join(f"{k}={v}" for k, v in self.degrees.items() if v > 1) or "1"

    def check_algorithm(self) -> None:
        """The algorithm's own constraints (its registered ``check``, planner/algorithms.py, which ``estimate`` runs
        again with the model and workload it prices) with the plan's model and workload, None where it names none:
        a plan every reader (`show`, ``init``, ``estimate``) takes alike."""
        from .algorithms import ALGORITHMS  # noqa: PLC0415 - the registry imports every schedule on first read
        from .candidate import Candidate  # noqa: PLC0415 - candidate imports this module

        alg = ALGORITHMS[self.algorithm]
        if alg.check is not None:
            alg.check(Candidate.from_plan(self), self.model, self.workload)

    # ---- derived
    @property
    def world_size(self) -> int:
        return world_size(self.degrees)

    @property
    def sp(self) -> int:
        return self.degrees["ulysses"] * self.degrees["ring"]

    def layout(self) -> Layout:
        """The shared rank/token arithmetic for this plan."""
        return Layout({k: v for k, v in self.degrees.items()}, tuple(self.order), self.token_layout, self.placement)

    def with_groups(self) -> "Plan":
        """A copy with every group's rank lists filled in from the layout (``groups``; never written to a file)."""
        return self.model_copy(update={"groups": self.layout().all_groups()})

    def summary(self) -> str:
        """Short human label, e.g. 'usp ulysses4 ring2 dp2 zigzag ulysses<ring<dp zero1'."""
        d = self.degrees
        parts = [self.algorithm]
        for n in ("tp", "ulysses", "ring", "team", "dp", "pp"):
            if d.get(n, 1) > 1:
                parts.append(f"{n}{d[n]}")
        if self.algorithm != "ulysses":
            parts.append(self.token_layout)
        if self.placement:
            parts.append(self.placement)
        if self.stage_layers is not None:
            parts.append("stages:" + stage_list(self.stage_layers))
        if self.virtual_stages is not None:
            parts.append(f"virtual:{self.virtual_stages}")
        if self.kv_chunks is not None:
            parts.append(f"kv_chunks:{self.kv_chunks}")
        parts.append(order_text(self.order, d) or "-")
        parts.append(f"zero{self.zero_stage}")
        if self.checkpointing != "none":
            parts.append(f"ckpt:{self.checkpointing}")
        if self.micro_batch_size != 1:
            parts.append(f"mbs{self.micro_batch_size}")
        return " ".join(parts)

    def check_world(self, world: int) -> None:
        """A world that does not match the plan is a clear error."""
        if world != self.world_size:
            raise PlanError("world_size", f"the plan needs {self.world_size} ranks "
                            f"({self.degree_text()}), the world has {world}",
                            f"launch {self.world_size} ranks or make a plan for {world}")

    # ---- io
    def save(self, path: str | Path) -> None:
        """Write the plan as YAML (or JSON for a .json path), atomically: the mesh, without its groups."""
        data = self.model_dump(mode="json", exclude_none=True)
        dump_data(data, path)

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        """A plan file as the planner reads it: definitions only (``sp_plan.profiles.plans.load_plan``, what the
        CLI reads, also resolves a model preset's and a distribution's name)."""
        return load_yaml_model(cls, path, "plan")
