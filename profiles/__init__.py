"""sp-plan profiles."""
