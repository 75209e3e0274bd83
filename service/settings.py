"""What `sp-plan serve` runs with: its flags, and the environment variables it has always read.

``Settings`` is a pydantic-settings class. Its sources, strongest first: the values passed in (the flags, as
cli/serve.py gives them), ``$SP_PLAN_SERVE_SETTINGS`` (the JSON that `serve --workers N` hands each uvicorn
worker), then ``$SP_PLAN_STORE`` and ``$SP_PLAN_TOKENS``. No other variable is read: a field is not configurable
from the environment by its bare name.
"""
from __future__ import annotations

import json
import os
from typing import Any

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from sp_plan.profiles.store import ENV_VAR as STORE_ENV
from sp_plan.service.auth import ENV_VAR as TOKENS_ENV
from sp_plan.pipeline import MAX_WORLD

SETTINGS_ENV = "SP_PLAN_SERVE_SETTINGS"
#: the fields read from their own environment variable (the same variables the CLI and the store read)
ENV_FIELDS = {"store": STORE_ENV, "tokens": TOKENS_ENV}


class ServeEnvironment(PydanticBaseSettingsSource):
    """The settings the environment holds: ``$SP_PLAN_SERVE_SETTINGS`` over ``$SP_PLAN_STORE`` and
    ``$SP_PLAN_TOKENS`` (an empty variable counts as unset, as the store and the token check treat it)."""

    def get_field_value(self, field, field_name: str) -> tuple[Any, str, bool]:
        """Unused: ``__call__`` reads the environment at once (pydantic-settings requires the method)."""
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {name: os.environ[var] for name, var in ENV_FIELDS.items() if os.environ.get(var)}
        values.update(json.loads(os.environ.get(SETTINGS_ENV) or "{}"))
        return values


class Settings(BaseSettings):
    """What `sp-plan serve` was started with (its flags of the same names, with the same defaults)."""

    model_config = SettingsConfigDict(extra="forbid")

    store: str | None = None  # --store; $SP_PLAN_STORE, else SQLite in the user data directory
    token_file: str | None = None  # --token-file
    #: $SP_PLAN_TOKENS, comma-separated: read where --token-file is not given; never written out (settings_env)
    tokens: SecretStr | None = Field(None, exclude=True, repr=False)
    private: bool = False  # --private
    max_world: int = Field(MAX_WORLD, ge=1)  # --max-world
    max_body: int = Field(4 * 2**20, ge=1)  # --max-body
    processes: int | None = Field(None, ge=1)  # --processes (default: the cores / uvicorn workers)
    cache_size: int = Field(1024, ge=0)
    freeze_gc: bool = False  # `sp-plan serve`: move the startup heap out of the collector's reach (gc.freeze)

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings) -> tuple[PydanticBaseSettingsSource, ...]:
        """The values passed in, then ServeEnvironment: no other variable, no .env file, no secrets directory."""
        return init_settings, ServeEnvironment(settings_cls)

    def listed_tokens(self) -> str | None:
        """``$SP_PLAN_TOKENS`` as read, or None."""
        return self.tokens.get_secret_value() if self.tokens is not None else None


def settings_env(settings: Settings) -> str:
    """The settings as ``$SP_PLAN_SERVE_SETTINGS`` for the uvicorn workers: every field but the tokens (each
    worker reads the token file or ``$SP_PLAN_TOKENS`` itself)."""
    return settings.model_dump_json()
