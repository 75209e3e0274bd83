"""The application pipeline's names where the service and older callers import them: it is ``sp_plan.pipeline``
(plan, estimate, report and tune for the CLI, the Python API and HTTP alike)."""
from __future__ import annotations

from sp_plan.pipeline import (MAX_WORLD, ClusterInfo, EstimateRequest, EstimateResponse, Inputs, PlanRequest,
                              PlanResponse, RankWork, Report, SearchInfo, build_cluster, check_mask_sizes,
                              documents_definition, estimate, mask_fields, mask_line, plan, profile_version, rank,
                              rank_work, report, report_plans, request_key, resolve, run_estimate, run_plan, search,
                              study_name, with_masks)

__all__ = ["MAX_WORLD", "ClusterInfo", "EstimateRequest", "EstimateResponse", "Inputs", "PlanRequest", "PlanResponse",
           "RankWork", "Report", "SearchInfo", "build_cluster", "check_mask_sizes", "documents_definition", "estimate",
           "mask_fields", "mask_line", "plan", "profile_version", "rank", "rank_work", "report", "report_plans",
           "request_key", "resolve", "run_estimate", "run_plan", "search", "study_name", "with_masks"]
