"""sp-plan runtime."""
