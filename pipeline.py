"""The application pipeline: plan, estimate, report and tune, the one path the CLI, the Python API and HTTP call.

Each step resolves the profile (the store and discovery layer: ``profiles.resolve``), searches and ranks (the pure
planner, given ``Params``), and explains (the rows with their equivalent plans, the per-rank work of a mask).
``run_plan(PlanRequest)`` = ``resolve`` (cluster, model, workload, profile) then ``search`` (grid or bayes, finished
plans); the service runs the two halves apart (resolve beside the store, search in its process pool), the CLI and
Python callers in one go. The request and response bodies are built from the models plan files already use
(Cluster, ModelSpec, Workload, Plan, Profile): no copies.

    import sp_plan
    ranked = sp_plan.plan(sp_plan.load_cluster("dgx-h100", nodes=2), sp_plan.load_model("llama3-8b"),
                          sp_plan.Workload(seq_len="128k"))
    ranked.to_pandas()        # one row per plan, the columns `sp-plan plan` prints
"""
from __future__ import annotations

import copy
import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sp_plan.planner.cluster import Cluster
from sp_plan.planner.errors import PlanError, of_type, require_extra, whole_number
from sp_plan.planner.estimate import Estimator
from sp_plan.planner.masks import imbalance, sample_rank_work
from sp_plan.planner.measured import mark
from sp_plan.planner.model import DEFAULT_TRIALS, MAX_SEED, MAX_TOP, MAX_TRIALS, ModelSpec, Workload
from sp_plan.planner.params import Params
from sp_plan.planner.plan import Plan, Prediction, one_placement_problem
from sp_plan.planner.profile import Profile
from sp_plan.planner.ranking import RankedPlans
from sp_plan.planner.yamlio import model_from_data
from sp_plan.planner.search import (SearchResult, Space, finish, finish_each, no_plan_error,
                                    profile_tag, ranked_rows)
from sp_plan.profiles import load_cluster, load_model
from sp_plan.profiles.plans import load_plan
from sp_plan.profiles.resolve import resolve_params
from sp_plan.workers import forked_grid_search, rerankings

if TYPE_CHECKING:
    from sp_plan.planner.sensitivity import Sensitivity

MAX_WORLD = 65536


def _inference_alias(data):
    """Accept ``workload.inference`` (the CLI's --inference) as ``training = not inference``."""
    if isinstance(data, dict) and isinstance(data.get("workload"), dict) and "inference" in data["workload"]:
        w = dict(data["workload"])
        inference = w.pop("inference")
        if not isinstance(inference, bool):
            raise PlanError("workload.inference", f"must be true or false, got {inference!r}", "pass true or false")
        if "training" in w and w["training"] == inference:
            raise PlanError("workload.inference", "contradicts workload.training", "pass only one of them")
        w["training"] = not inference
        data = {**data, "workload": w}
    return data


def documents_definition(spec, files: bool = True):
    """A documents spec as the planner takes it: a named distribution, a file of lengths (only where ``files``: read
    here and kept as a histogram with the file's name and sha256), a list of lengths or a definition, as it is."""
    # pandas reads a file of lengths (~0.5 s to import): a workload without documents does not pay for it
    from sp_plan.profiles.documents import documents_from_file, resolve_documents  # noqa: PLC0415

    if isinstance(spec, (str, Path)) and files:
        if str(spec).endswith(".parquet"):  # pandas reads Parquet through pyarrow, the parquet extra
            require_extra("pyarrow", "parquet", "documents")
        return documents_from_file(spec) if isinstance(spec, Path) else resolve_documents(spec)
    if isinstance(spec, Path):
        raise PlanError("documents", "a file is read where the request is made",
                        "send its histogram or lengths inline (the CLI and Client do)")
    return _named(spec) if isinstance(spec, str) else spec


def _named(name: str):
    """A named distribution for a request that cannot read files (the service): names only."""
    from sp_plan.profiles.documents import named_documents  # noqa: PLC0415 - numpy and the table, as above

    return named_documents(name)


def mask_fields(documents=None, window: int | None = None, window_pattern: str | None = None,
                seed: int | None = None, base: Workload | None = None, files: bool = True) -> dict[str, Any]:
    """A workload's documents, window and seed from the options given (None: as in ``base``), as Workload fields; a
    window size alone keeps ``base``'s layer pattern, a pattern alone its window size."""
    planned = base.window if base is not None else None
    if planned is not None and (window is None) != (window_pattern is None):
        window = planned.size if window is None else window
        window_pattern = planned.pattern if window_pattern is None else window_pattern
    if window_pattern is not None and window is None:
        raise PlanError("window_pattern", "a layer pattern needs a window size", "give the window too, e.g. "
                        "--window 4096 --window-pattern 5:1 (in Python: window=4096, window_pattern='5:1')")
    if window is not None:
        window = whole_number("window", window, 1, "give a window size W >= 1 (or no window for full attention)")
    if seed is not None:
        seed = whole_number("seed", seed, 0, f"give a seed from 0 to {MAX_SEED:,}", high=MAX_SEED)
    fields = {k: getattr(base, k) for k in ("documents", "window", "seed")} if base is not None else {}
    if documents is not None:
        fields["documents"] = documents_definition(documents, files)
    if window is not None:
        fields["window"] = {"size": window, "pattern": window_pattern}
    if seed is not None:
        fields["seed"] = seed
    return fields


def with_masks(workload: Workload, documents=None, window: int | None = None, window_pattern: str | None = None,
               seed: int | None = None) -> Workload:
    """``workload`` (a Workload or a mapping) with the documents, window and seed given (a name, a file or a list of
    lengths; None: its own)."""
    workload = as_model(Workload, workload, "workload", "sp_plan.Workload(seq_len=...) or a mapping")
    if documents is None and window is None and window_pattern is None and seed is None:
        return workload
    fields = mask_fields(documents, window, window_pattern, seed, base=workload)
    return Workload.model_validate({**workload.model_dump(exclude={"documents", "window", "seed"}), **fields})


def _inline_masks(data):
    """A request's ``workload.documents`` given as a distribution's name, and ``workload.window_pattern`` beside an
    integer ``workload.window``, as the CLI's flags are: resolved here (names only; a file is sent inline)."""
    if not (isinstance(data, dict) and isinstance(data.get("workload"), dict)):
        return data
    w = dict(data["workload"])
    if isinstance(w.get("documents"), str):
        w["documents"] = _named(w["documents"])
    if "window_pattern" in w:
        pattern = w.pop("window_pattern")
        if not isinstance(w.get("window"), int) or isinstance(w.get("window"), bool):
            raise PlanError("workload.window_pattern", "a layer pattern needs an integer window beside it",
                            "send window: W with window_pattern, or window: {size: W, pattern: '5:1'}")
        w["window"] = {"size": w["window"], "pattern": pattern}
    return {**data, "workload": w}


def as_model(cls: type[BaseModel], value, field: str, how: str):
    """``value`` as a ``cls``: itself, or a mapping validated as one (a PlanError naming ``field``); anything else is a
    PlanError saying ``how`` to pass one."""
    if isinstance(value, dict):
        return model_from_data(cls, value, field)
    return of_type(field, value, cls, how)


def _bounded(field: str, value: int, low: int, high: int, fix: str) -> int:
    """``value`` if it lies in [low, high], else a PlanError naming ``field`` (not pydantic's error dump)."""
    if not low <= value <= high:
        raise PlanError(field, f"must be from {low:,} to {high:,}, got {value:,}", fix)
    return value


def _workload_aliases(data):
    """The request's workload as the CLI spells it: ``inference``, a documents name and ``window_pattern``."""
    return _inline_masks(_inference_alias(data))


class AsRequested:
    """A request's workload in /openapi.json: ``Workload``'s schema with the forms a request also takes
    (``_workload_aliases``: seq_len as '128k', a distribution's name, an integer window with window_pattern, and
    inference), so that a client generated from the document sends what the guides send."""

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema, handler) -> dict:
        schema = copy.deepcopy(handler.resolve_ref_schema(handler(core_schema)))  # a copy: responses keep Workload's
        props = schema["properties"]
        props["seq_len"] = {"anyOf": [{"type": "integer", "exclusiveMinimum": 0},
                                      {"type": "string", "description": "131072, 128k or 1m"}], "title": "Seq Len"}
        props["documents"]["anyOf"][:0] = [{"type": "string", "description": "a named distribution (GET /v1/presets)"},
                                           {"type": "array", "items": {"type": "integer", "minimum": 1},
                                            "description": "document lengths, drawn with replacement"}]
        props["window"]["anyOf"].insert(0, {"type": "integer", "minimum": 1, "description": "W, with window_pattern"})
        props["window_pattern"] = {"type": "string", "description": "LOCAL:GLOBAL layers beside an integer window, e.g. 5:1"}
        props["inference"] = {"type": "boolean", "description": "forward only: training is not inference"}
        return schema


class PlanRequest(BaseModel):
    """What `sp-plan plan`, ``Client.plan`` and ``POST /v1/plan`` ask for."""

    model_config = ConfigDict(extra="forbid")
    cluster: str | Cluster = Field(description="a cluster preset name (with nodes) or an inline cluster")
    nodes: int | None = Field(default=None, description="node count for a preset (default 1)")
    model: str | ModelSpec = Field(description="a model preset name or an inline model")
    workload: Annotated[Workload, AsRequested] = Field(description="seq_len (an integer or '128k'), batch, causal, training "
                               "(or inference: true); documents (a distribution's name, a histogram or a list of "
                               "lengths), window (W, with window_pattern '5:1'), seed")
    search: Literal["grid", "bayes"] = "grid"
    # bounds checked by _bounded (a PlanError naming the field), declared here for /openapi.json
    trials: int = Field(default=DEFAULT_TRIALS, description="optuna trials for search bayes",
                        json_schema_extra={"minimum": 1, "maximum": MAX_TRIALS})
    seed: int = Field(default=0, description="sampler seed for search bayes",
                      json_schema_extra={"minimum": 0, "maximum": MAX_SEED})
    top: int = Field(default=5, ge=1, le=MAX_TOP, description="how many ranked layouts to return")
    use_profile: bool = Field(default=True, description="price with the cluster's stored calibration profile")
    profile: str | None = Field(default=None, description="a stored profile id (default: the cluster's newest); "
                                "the CLI also takes a profile file")
    families: bool = Field(default=False, description="also return the fastest layout of every algorithm variant "
                           "(what `sp-plan plan` prints as its second table; most of a large answer's bytes)")

    _alias = model_validator(mode="before")(_workload_aliases)

    @field_validator("trials")
    @classmethod
    def _trials(cls, v: int) -> int:
        return _bounded("trials", v, 1, MAX_TRIALS, f"ask for 1 to {MAX_TRIALS:,} trials (200 is the default)")

    @field_validator("seed")
    @classmethod
    def _seed(cls, v: int) -> int:
        return _bounded("seed", v, 0, MAX_SEED, f"give a seed from 0 to {MAX_SEED:,}")


class EstimateRequest(BaseModel):
    """What `sp-plan estimate`, ``Client.estimate`` and ``POST /v1/estimate`` ask for: one plan priced."""

    # built with the module, not on first use as EstimateResponse: FastAPI builds a deferred body model inside its
    # parameter and warns that the parameter's alias does not apply there
    model_config = ConfigDict(extra="forbid")
    plan: Plan
    cluster: str | Cluster
    nodes: int | None = Field(default=None, description="node count for a preset (default 1)")
    model: str | ModelSpec | None = Field(default=None, description="default: the plan's")
    workload: Annotated[Workload, AsRequested] | None = Field(default=None, description=(
        "default: the plan's (the same forms as a plan request's); the plan's documents, window and seed stay where "
        "this sets none of them"))
    use_profile: bool = True
    profile: str | None = None

    _alias = model_validator(mode="before")(_workload_aliases)


class ClusterInfo(BaseModel):
    """The cluster a response was computed for, as the CLI's header line names it."""

    name: str
    nodes: int
    world_size: int
    device: str
    fingerprint: str
    topology_fingerprint: str

    @classmethod
    def of(cls, c: Cluster) -> "ClusterInfo":
        return cls(name=c.name, nodes=c.num_nodes, world_size=c.world_size, device=c.device(0).model,
                   fingerprint=c.fingerprint(), topology_fingerprint=c.topology_fingerprint())


class SearchInfo(BaseModel):
    """How the search went: its kind, the candidates in the space and priced, bayes trials."""

    kind: Literal["grid", "bayes"]
    space: int
    evaluated: int
    trials: int | None = None
    best_trial: int | None = None


class PlanResponse(BaseModel):
    """Ranked plans with breakdowns, the best of each algorithm variant, the winner's plan file, the profile used."""

    id: str | None = Field(default=None, description="GET /v1/plans/{id} (set by the service)")
    cluster: ClusterInfo
    model: ModelSpec
    workload: Workload
    notes: list[str] = Field(default_factory=list, description="what the workload means that its fields do not say "
                             "outright, as the CLI prints them (a window covering every document: full attention)")
    search: SearchInfo
    profile: str | None = Field(description="id of the profile that priced the plans (\"file\": one without); null: none")
    profile_line: str
    plans: list[Plan] = Field(description="the top rows fastest first, each followed by its equivalent alternatives; "
                              "each plan as a plan file holds it: the mesh (degrees, order) and its predictions, "
                              "without groups (Plan.with_groups() derives every group's ranks)")
    families: list[Plan] = Field(default_factory=list, description="the fastest layout of every algorithm variant "
                                 "(empty unless the request asked for families)")
    winner: Plan = Field(description="the best plan, as `sp-plan plan -o` writes it (no groups: `init` and "
                         "Plan.with_groups() derive them from degrees and order); the first of plans")


class EstimateResponse(BaseModel):
    """One plan priced: the plan with its prediction and the profile used."""

    # built on first use (defer_build), as RankWork is: `sp-plan plan` loads this module and never uses them, and
    # building a model's validator costs a few milliseconds of every start
    model_config = ConfigDict(defer_build=True)
    cluster: ClusterInfo
    model: ModelSpec
    workload: Workload
    notes: list[str] = Field(default_factory=list, description="as in a plan answer")
    profile: str | None
    profile_line: str
    plan: Plan


@dataclass
class Inputs:
    """A request resolved: the objects the search prices, the parameters and the profile line."""

    cluster: Cluster
    model: ModelSpec
    workload: Workload | None
    params: Params
    line: str
    profile: Profile | None


def _cluster(spec: str | Cluster, nodes: int | None, max_world: int | None, files: bool = True) -> Cluster:
    """The inline cluster, or the preset (or, with ``files``, the file) with ``nodes``; at most ``max_world``
    ranks."""
    if isinstance(spec, Cluster):
        if nodes is not None and nodes != spec.num_nodes:
            raise PlanError("nodes", f"the inline cluster lists {spec.num_nodes} node(s), not {nodes}",
                            "drop nodes for an inline cluster")
        c = spec
    else:
        if max_world and nodes and nodes > max_world:  # before building a graph of that many nodes
            raise PlanError("nodes", f"{nodes} nodes exceed the limit of {max_world:,} ranks", _world_fix(max_world))
        c = load_cluster(spec, nodes, files)
    if max_world and c.world_size > max_world:
        raise PlanError("cluster", f"a world of {c.world_size:,} ranks exceeds the limit of {max_world:,}",
                        _world_fix(max_world))
    return c


def _world_fix(max_world: int) -> str:
    return f"ask for at most {max_world:,} ranks (the service's --max-world)"


def _profile_spec(use_profile: bool, profile: str | Profile | None):
    if not use_profile and profile:
        raise PlanError("profile", "both a profile and use_profile false given", "pass one of them")
    return False if not use_profile else profile


def check_mask_sizes(w: Workload | None) -> Workload | None:
    """``w`` as it is: the Workload itself refuses a window or document longer than any sequence (its
    ``_mask_sizes``); kept for callers of the application layer."""
    return w


def build_cluster(req: PlanRequest | EstimateRequest, max_world: int | None = MAX_WORLD, files: bool = True
                  ) -> Cluster:
    """The request's cluster: the inline one, or the preset with ``nodes`` (``files``: a name may be a cluster
    file, as on the CLI; the service passes False); at most ``max_world`` ranks."""
    return _cluster(req.cluster, req.nodes, max_world, files)


def resolve(req: PlanRequest | EstimateRequest, store=None, max_world: int | None = MAX_WORLD,
            profile: Profile | None = None, cluster: Cluster | None = None, files: bool = True) -> Inputs:
    """Build cluster, model and workload and find the profile (``store``: a Store, a URL or None for the default);
    ``profile`` overrides ``req.profile`` with an already loaded Profile, ``cluster`` the request's cluster with
    the one ``build_cluster`` built for it; ``files=False``: cluster and model names are presets only."""
    c = cluster or build_cluster(req, max_world, files)
    m = req.model if isinstance(req.model, ModelSpec) or req.model is None else load_model(req.model, files)
    params, line, prof = resolve_params(c, _profile_spec(req.use_profile, profile or req.profile), store)
    return Inputs(c, m, check_mask_sizes(req.workload), params, line, prof)


def study_name(inputs: Inputs) -> str:
    """The optuna study of a CLI bayes search (resumable with --storage); a masked workload's names its mask too."""
    w = inputs.workload
    name = f"{inputs.cluster.fingerprint()}-{inputs.model.name}-{w.seq_len}-{w.batch}"
    if w.documents is None and w.window is None:
        return name
    mask = w.model_dump_json(include={"documents", "window", "seed", "causal"})
    return f"{name}-{hashlib.sha256(mask.encode()).hexdigest()[:12]}"


def _searched(inputs: Inputs, top: int, kind: str, trials: int, seed: int, storage: str | None, study: str | None,
              progress: Callable[[int, int], None] | None, space: Space | None, jobs: int = 1,
              families: bool = False) -> SearchResult:
    """The search's result: the grid's first ``top`` distinct step times exact (every row's equivalents are in it),
    searched in up to ``jobs`` processes (``workers``), or a complete ranking of the bayes trials' layouts; a search
    that ranks nothing is a PlanError."""
    c, m, w = inputs.cluster, inputs.model, inputs.workload
    if kind == "grid":
        res = forked_grid_search(c, m, w, space, jobs, progress=progress, keep=top, params=inputs.params,
                                 distinct=True, ahead=families)
    else:
        from sp_plan.planner.bayes import bayes_search  # noqa: PLC0415 - optuna (~1 s): only a bayes search loads it

        res = bayes_search(c, m, w, trials=trials, seed=seed, storage=storage, space=space,
                           study_name=study or study_name(inputs), progress=progress, params=inputs.params)
    res.profile, res.profile_line = profile_tag(inputs.profile), inputs.line
    if not res.ranked:
        raise no_plan_error(c, w, res)
    return res


def rank(inputs: Inputs, top: int = 5, kind: Literal["grid", "bayes"] = "grid", trials: int = 200, seed: int = 0,
         storage: str | None = None, study: str | None = None, progress: Callable[[int, int], None] | None = None,
         space: Space | None = None, jobs: int = 1, families: bool = False) -> tuple[RankedPlans, SearchResult]:
    """Search once (grid, in up to ``jobs`` processes, or ``trials`` of optuna's TPE) and rank: the top ``top`` rows
    (equivalent candidates share a row: planner/equivalent.py), the layouts tune measured ranked by their measurement
    (planner/measured.py); with ``families``, a split grid's shares predict their best of each variant too."""
    res = _searched(inputs, top, kind, trials, seed, storage, study, progress, space, jobs, families)
    c, m, w = inputs.cluster, inputs.model, inputs.workload
    return ranked_rows(res, c, m, w, top, inputs.profile, inputs.params), res


def search(req: PlanRequest, inputs: Inputs, storage: str | None = None, study: str | None = None,
           progress: Callable[[int, int], None] | None = None, jobs: int = 1) -> PlanResponse:
    """The response to a plan request: ``rank``'s rows, each followed by its equivalent plans, and, if
    ``req.families``, the best of each algorithm variant, all from that one ranking (a grid searched in up to
    ``jobs`` processes: ``workers``)."""
    ranked, res = rank(inputs, req.top, req.search, req.trials, req.seed, storage, study, progress, jobs=jobs,
                       families=req.families)
    c, m, w = inputs.cluster, inputs.model, inputs.workload
    plans = ranked.flat()
    bayes = req.search == "bayes"
    info = SearchInfo(kind=req.search, space=res.space, evaluated=res.evaluated,
                      trials=getattr(res, "trials", None) if bayes else None,
                      best_trial=getattr(res, "best_trial", None) if bayes else None)
    return PlanResponse(cluster=ClusterInfo.of(c), model=m, workload=w, notes=w.notes + cluster_notes(c), search=info,
                        profile=res.profile,
                        profile_line=inputs.line, plans=plans,
                        families=mark(finish_each(res, c, m, w), inputs.profile, m, w) if req.families else [],
                        winner=plans[0])


def run_plan(req: PlanRequest, store=None, storage: str | None = None,
             progress: Callable[[int, int], None] | None = None, max_world: int | None = None) -> PlanResponse:
    """Plan in one call (the Python API and `sp-plan plan`): resolve the request (a PlanRequest or its mapping),
    then search."""
    req = as_model(PlanRequest, req, "request", "a PlanRequest or a mapping of its fields")
    return search(req, resolve(req, store, max_world), storage=storage, progress=progress)


def plan(cluster: Cluster | str, model: ModelSpec | str | dict, workload: Workload | dict, top_k: int = 5,
         progress: Callable[[int, int], None] | None = None, space: Space | None = None, profile=None, store=None,
         *, documents=None, window: int | None = None, window_pattern: str | None = None,
         seed: int | None = None, nodes: int | None = None) -> RankedPlans:
    """The ``top_k`` best rows for this cluster, model and workload, fastest first (deterministic), each with its
    equivalent plans (``RankedPlans.equivalents``); ``RankedPlans.to_pandas()`` is the CLI's table. The cluster and
    model may be a preset's name or a file's path, the model and workload a mapping (``api_inputs``); ``nodes`` is a
    preset cluster's node count (``--nodes``; default 1).

    ``profile``: a Profile, a profile id or file (str), None (the cluster's profile in the store, if any) or False
    (none: opens no store); ``store``: where an id or None looks (a Store or a URL; None: ``$SP_PLAN_STORE``, else
    the user data directory's). Each Plan records the profile used (``Plan.profile``); a layout the profile's tune
    measured for this model and workload ranks by its measured step and carries it (``Plan.measured``). The
    workload takes ``documents`` (a named distribution, a file of lengths or a list of lengths), ``window``,
    ``window_pattern`` ('5:1') and ``seed``. Plans come as a plan file holds them: the mesh (degrees, order)
    without its groups; ``Plan.with_groups()`` derives every group's ranks."""
    cluster, model, workload = api_inputs(cluster, model, workload, nodes)
    top_k = whole_number("top_k", top_k, 1, "ask for top_k >= 1 rows")
    if progress is not None and not callable(progress):  # called only once the search runs: checked before it
        raise PlanError("progress", f"{type(progress).__name__} is not callable",
                        "pass a function progress(done, total), or None")
    w = with_masks(workload, documents, window, window_pattern, seed)
    check_space(space, cluster, model, w)
    params, line, prof = resolve_params(cluster, profile, store)
    ranked = rank(Inputs(cluster, model, w, params, line, prof), top_k, progress=progress, space=space)[0]
    ranked.notes = w.notes + cluster_notes(cluster)  # the notes a PlanResponse and the CLI carry
    return ranked


def check_space(space: Space | None, cluster: Cluster, model: ModelSpec, w: Workload) -> None:
    """A caller's search space enumerates the layouts of its own world, model and workload: one built for others (a
    workload without the ``window`` or ``documents`` given beside it) would rank layouts of another problem."""
    if space is None:
        return
    of_type("space", space, Space, "sp_plan.planner.search.Space(world, model, workload), or None for the whole space")
    for name, mine, given in (("world", space.world, cluster.world_size), ("model", space.model, model),
                              ("workload", space.work, w)):
        if mine != given:
            raise PlanError("space", f"the search space was built for another {name} than the plan's",
                            "build it from the plan's inputs: Space(cluster.world_size, model, workload), with the "
                            "workload's documents and window in it")


def api_inputs(cluster, model, workload, nodes: int | None = None) -> tuple[Cluster, ModelSpec, Workload]:
    """The Python API's cluster, model and workload as the planner takes them: a preset's name (of ``nodes`` nodes)
    or a file's path for the cluster and model (as ``--cluster``, ``--nodes`` and ``--model`` read them), a mapping
    for a model or workload; anything else is a PlanError naming the argument."""
    if nodes is not None:
        nodes = whole_number("nodes", nodes, 1, "pass nodes=N, a whole number of at least 1 (or None: 1 node)")
    if isinstance(cluster, (str, Path)):
        cluster = load_cluster(str(cluster), nodes)
    elif nodes is not None and isinstance(cluster, Cluster) and nodes != cluster.num_nodes:
        raise PlanError("nodes", f"the cluster given has {cluster.num_nodes} node(s), not {nodes}",
                        "drop nodes=, or pass the preset's name with nodes=")
    if isinstance(model, (str, Path)):
        model = load_model(str(model))
    of_type("cluster", cluster, Cluster, "sp_plan.load_cluster(name or file), or the name")
    model = as_model(ModelSpec, model, "model", "sp_plan.load_model(name or file), a name or a mapping")
    workload = as_model(Workload, workload, "workload", "sp_plan.Workload(seq_len=...) or a mapping")
    return cluster, model, workload


def estimate(plan: Plan | str | dict, cluster: Cluster | str, model: ModelSpec | str | dict | None = None,
             workload: Workload | dict | None = None, profile=None, store=None, *,
             documents=None, window: int | None = None, window_pattern: str | None = None,
             seed: int | None = None, nodes: int | None = None) -> Prediction:
    """The prediction of ``plan`` (step time, tokens/s, MFU, peak memory, the per-phase breakdown) for ``workload``
    with the documents, window and seed given, priced with ``profile`` as ``plan`` (this module's) takes it; the plan
    may be a plan file's path or a mapping, the rest as ``plan`` takes them. As `sp-plan estimate` does, a model or
    workload left out is the plan's, and the plan's documents, window and seed stay where ``workload`` sets none."""
    plan = api_plan(plan, "plan")
    model = _plans(model, plan.model, "model")
    workload = plan_masks(_plans(workload, plan.workload, "workload"), plan.workload)
    cluster, model, workload = api_inputs(cluster, model, workload, nodes)
    params, _, _ = resolve_params(cluster, profile, store)
    return Estimator(cluster, model, with_masks(workload, documents, window, window_pattern, seed), params=params)(plan)


def _plans(given, of_plan, field: str):
    """``given``, or the plan's own where it is None; neither is a PlanError naming ``field``."""
    if given is None and of_plan is None:
        raise PlanError(field, f"the plan names no {field}", f"pass {field}= (a preset name, a file or a mapping)")
    return of_plan if given is None else given


def plan_masks(workload, base: Workload | None):
    """``workload`` (a Workload or a mapping) with ``base``'s documents, window and seed where it sets none of them
    (the seed goes with the documents: a workload that sets its own documents keeps its own seed)."""
    w = as_model(Workload, workload, "workload", "sp_plan.Workload(seq_len=...) or a mapping")
    kept = {"documents", "window", "seed"} - w.model_fields_set - ({"seed"} if "documents" in w.model_fields_set else set())
    if base is None or w is base or not kept:
        return w
    return Workload.model_validate({**w.model_dump(exclude=kept), **base.model_dump(include=kept)})


def api_plan(plan, field: str) -> Plan:
    """The Python API's plan as the planner takes it: a Plan, a plan file's path or a mapping; anything else is a
    PlanError naming ``field``."""
    if isinstance(plan, (str, Path)):
        return load_plan(plan)
    return as_model(Plan, plan, field, "a Plan, a plan file's path or a mapping")


def run_estimate(req: EstimateRequest, store=None, max_world: int | None = None,
                 profile: Profile | None = None, files: bool = True) -> EstimateResponse:
    """Price one plan (the Python API, `sp-plan estimate` and POST /v1/estimate; ``files=False``: cluster and model
    names are presets only); ``req`` is an EstimateRequest or its mapping."""
    req = as_model(EstimateRequest, req, "request", "an EstimateRequest or a mapping of its fields")
    p = req.plan
    inputs = resolve(req, store, max_world, profile, files=files)
    m = inputs.model or p.model
    if m is None:
        raise PlanError("model", "the plan names no model", "pass a model (preset name or inline)")
    # as the Python API and the CLI: the plan's documents, window and seed stay where the workload given sets none
    w = check_mask_sizes(plan_masks(inputs.workload, p.workload) if inputs.workload else p.workload)
    if w is None:
        raise PlanError("workload", "the plan names no workload", "pass a workload (seq_len, batch, ...)")
    pred = Estimator(inputs.cluster, m, w, params=inputs.params)(p)
    tag = profile_tag(inputs.profile)
    return EstimateResponse(cluster=ClusterInfo.of(inputs.cluster), model=m, workload=w,
                            notes=w.notes + cluster_notes(inputs.cluster) + plan_notes(p, w) + fit_notes(pred),
                            profile=tag,
                            profile_line=inputs.line, plan=p.model_copy(update={"predicted": pred, "profile": tag}))


def cluster_notes(c: Cluster) -> list[str]:
    """A cluster of nodes that differ (a discovered one whose hosts differ): priced as node 0's hardware."""
    if c.homogeneous:
        return []
    kinds = list(dict.fromkeys(c.nodes))
    return [f"cluster: its nodes are of {len(kinds)} types ({', '.join(kinds)}); every node is priced like node 0's "
            f"{kinds[0]}"]


def plan_notes(plan: Plan, w: Workload) -> list[str]:
    """What a plan means on this workload that its price does not say: a layout the runtime refuses for these
    layers (``planner.plan.one_placement_problem``); a ZeRO stage or checkpointing that inference has no use for."""
    problem = one_placement_problem(plan.token_layout, w)
    notes = [f"{problem}: the runtime refuses this plan at init, and `sp-plan plan` chooses zigzag, striped or "
             "contiguous for it"] if problem else []
    if not w.training and (plan.zero_stage or plan.checkpointing != "none"):
        notes.append(f"inference: zero{plan.zero_stage} and checkpointing {plan.checkpointing} are priced as zero0 "
                     "without checkpointing (whole weights, no gradients to shard, nothing recomputed); an export "
                     "that shards the weights would gather them every forward")
    return notes


def fit_notes(pred: Prediction) -> list[str]:
    """A plan whose predicted peak memory is over the device's: said in words, as a service's client reads notes."""
    if pred.fits:
        return []
    gib = 2.0 ** 30
    return [f"peak memory {pred.peak_memory_bytes / gib:,.1f} GiB a rank is over the device's "
            f"{pred.memory_capacity_bytes / gib:,.1f} GiB: the plan does not fit"]


# ---- report: the rows, the plan it is about, the sensitivity
@dataclass
class Report:
    """What the HTML report shows (integrations/report.py renders it): the rows fastest first, the index of the
    plan it is about, the profile and its line, and the winner's sensitivity (None: not asked)."""

    rows: list[Plan]
    chosen: int
    cluster: Cluster
    profile: Profile | None
    line: str
    sensitivity: Sensitivity | None = None
    ranked: int | None = None  # the leading rows that are the ranking's top (``report_plans``)


def report_plans(plans: list[Plan], families: list[Plan], extra: Plan | None = None) -> tuple[list[Plan], int, int]:
    """The report's rows: the top plans, the best of every other algorithm variant and ``extra`` (a plan file's
    plan), each once, fastest first; the index of the plan the report is about (``extra``, else the winner); and
    how many leading rows are the ranking's top, in its order (the rows after them rank below it, uncounted)."""
    rows, seen = [], set()
    for p in [*plans, *families, *([extra] if extra else [])]:
        if p.summary() not in seen:
            seen.add(p.summary())
            rows.append(p)
    rows.sort(key=lambda p: p.predicted.step_time_s)
    about = (extra or plans[0]).summary()
    ranked = 0
    while ranked < min(len(rows), len(plans)) and rows[ranked].summary() == plans[ranked].summary():
        ranked += 1
    return rows, next(i for i, p in enumerate(rows) if p.summary() == about), ranked


def report(cluster: Cluster | str, model: ModelSpec | str | dict, workload: Workload | dict,
           given: Plan | str | dict | None = None, top: int = 8, sensitivity: bool = True, profile=None, store=None,
           jobs: int = 1) -> Report:
    """The report of a fresh search (the ``top`` plans and the best of each algorithm variant), with ``given`` (a
    plan file's plan, priced here) among its rows and chosen; ``sensitivity``: the winner re-ranked under each
    changed input. Cluster, model, workload, ``profile`` and ``store`` as ``plan`` takes them; the searches run in
    up to ``jobs`` processes (``workers``)."""
    cluster, model, workload = api_inputs(cluster, model, workload)
    given = None if given is None else api_plan(given, "given")
    top = whole_number("top", top, 1, "ask for 1 or more plans")
    jobs = whole_number("jobs", jobs, 1, "pass jobs=1 or more processes")
    params, line, prof = resolve_params(cluster, profile, store)
    res = forked_grid_search(cluster, model, workload, None, jobs, keep=top, params=params)
    res.profile, res.profile_line = profile_tag(prof), line
    if not res.ranked:
        raise no_plan_error(cluster, workload, res)
    from sp_plan.planner.sensitivity import sensitivity as rerank  # noqa: PLC0415 - a report's step: plan does without

    plans, families = finish(res, cluster, model, workload, top), finish_each(res, cluster, model, workload)
    extra = None
    if given is not None:
        extra = given.model_copy(update={"model": model, "workload": workload, "predicted": res.estimator(given),
                                         "profile": profile_tag(prof), "cluster": cluster.name,
                                         "cluster_fingerprint": cluster.fingerprint()})
    rows, chosen, ranked = report_plans(plans, families, extra)
    sen = rerank(cluster, model, workload, plans[0], params, each=rerankings(jobs)) if sensitivity else None
    return Report(rows, chosen, cluster, prof, line, sen, ranked)


def tune(cluster: Cluster, model: ModelSpec, workload: Workload, store=None, opts=None, progress=None):
    """Profile this cluster on the running torch.distributed world (``sp_plan.profiles.tune.run.tune``): measure
    links and kernels, run the candidates most likely to win, fit and store the profile; collective."""
    from sp_plan.profiles.tune.run import tune as run_tune  # noqa: PLC0415 - torch: only a tune loads it

    return run_tune(cluster, model, workload, store, opts, progress)


def mask_line(w: Workload | None) -> str:
    """The workload's documents and window in a few words, for header lines ('' without them)."""
    if w is None:
        return ""
    parts = []
    if w.documents is not None:
        d = w.documents
        parts.append(f"documents {getattr(d, 'name', '') or d.source or d.kind} (seed {w.seed})")
    if w.window is not None:  # bidirectional: a query sees W - 1 keys on each side (runtime ring.sees)
        parts.append(f"window {w.window.size}" + ("" if w.causal else " each way")
                     + (f" on {w.window.pattern} layers" if w.window.pattern else ""))
    return ", ".join(parts)


class RankWork(BaseModel):
    """Per ring rank of a plan, one sample pack of its workload: tokens and score entries (attention work) under the
    plan's token layout; ``global_pairs`` on a window pattern's global layers (``pairs``: its windowed ones)."""

    model_config = ConfigDict(defer_build=True)  # as EstimateResponse's
    token_layout: str
    documents: int = Field(description="documents in the sample pack (a document cut at the sequence's end counts)")
    tokens: list[int]
    pairs: list[int]
    global_pairs: list[int] | None = None

    @property
    def imbalance(self) -> float:
        """The busiest rank's score entries over the mean (1.0: even); on the windowed layers with a window."""
        return imbalance(self.pairs)

    @property
    def global_imbalance(self) -> float | None:
        """The same on a window pattern's global layers (None without a pattern)."""
        return None if self.global_pairs is None else imbalance(self.global_pairs)


def rank_work(p: Plan) -> RankWork | None:
    """The plan's per-rank work on its workload's first sample pack, or None when the workload has no mask to show;
    ``p`` is a Plan or its mapping."""
    p = as_model(Plan, p, "plan", "a Plan (one of sp_plan.plan's rows) or a mapping")
    w = check_mask_sizes(p.workload)
    win = None if w is None else w.mask_window
    if w is None or (w.documents is None and win is None):
        return None
    ring = p.degrees["ring"]
    local = sample_rank_work(w, p.token_layout, ring, win.size if win else None)
    glob = None
    layers = p.model.layers if p.model is not None else None
    if win is not None and win.pattern is not None and (layers is None or win.windowed_layers(layers) < layers):
        glob = [int(x) for x in sample_rank_work(w, p.token_layout, ring, None).pairs]  # some layer is global
    return RankWork(token_layout=p.token_layout, documents=len(local.cu_seqlens) - 1,
                    tokens=[int(x) for x in local.tokens], pairs=[int(x) for x in local.pairs], global_pairs=glob)


def profile_version(prof: Profile | None) -> str | None:
    """A hash of the profile document: a new or replaced profile changes it."""
    if prof is None:
        return None
    return hashlib.sha256(json.dumps(prof.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:16]


#: the code an answer is computed by: the planner, this pipeline, its worker processes and the default parameters
#: (profiles/kernels.py and its table), relative to the package root
ANSWERING_CODE = ("planner", "pipeline.py", "workers.py", "profiles/kernels.py", "profiles/kernels.yaml")


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """A hash of ``ANSWERING_CODE``'s files: an answer stored by other code (an older sp-plan, whose planner priced or
    ranked otherwise) is not served as this code's. Read once per process."""
    return tree_hash(Path(__file__).parent, ANSWERING_CODE)


def tree_hash(root: Path, names: tuple[str, ...]) -> str:
    """A hash of the named files under ``root`` and of the .py files of the named folders, with their paths."""
    files = sorted(f for name in names for f in ((root / name).rglob("*.py") if (root / name).is_dir() else
                                                 [root / name]) if f.is_file())
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def request_key(req: PlanRequest, inputs: Inputs) -> str:
    """The canonical hash of a plan request's resolved inputs, search options, profile version and the version of
    the code that answers it (``code_version``)."""
    data = {"cluster": inputs.cluster.model_dump(mode="json"), "model": inputs.model.model_dump(mode="json"),
            "workload": inputs.workload.model_dump(mode="json"), "search": req.search, "top": req.top,
            "bayes": [req.trials, req.seed] if req.search == "bayes" else None,
            "profile": profile_version(inputs.profile), "line": inputs.line, "code": code_version()}
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]
