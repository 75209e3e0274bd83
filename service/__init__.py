"""sp_plan.service: the planner service (`sp-plan serve`), a thin HTTP layer over the planner and the profile store."""
