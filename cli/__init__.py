"""sp-plan cli."""
