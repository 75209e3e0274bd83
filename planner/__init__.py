"""sp-plan's planner: cluster graphs, layouts, schedules, the link-load cost engine and search."""
