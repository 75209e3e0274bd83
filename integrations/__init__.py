"""sp_plan.integrations: a plan into the user's stack (exporters, Hugging Face transformers, reports)."""
