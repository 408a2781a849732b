"""User settings shared by the CLI, the window and the API, from one typed schema.

Values come from (highest first) command-line flags, `HEARTHSIDE_*` environment variables
and the field defaults below.
"""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HEARTHSIDE_", extra="ignore")

    home: str | None = Field(
        default=None, description="Data directory (models, database); default: the OS data dir."
    )
    context_size: int = Field(default=4096, ge=16, description="Context window in tokens.")
    threads: int | None = Field(
        default=None, ge=1, description="Decode threads; default: the physical core count."
    )
    batch_threads: int | None = Field(
        default=None, ge=1, description="Prompt-processing threads; default: all logical cores."
    )
    parallel: int | None = Field(
        default=None,
        ge=1,
        le=64,  # core/engine/config.py's MAX_PARALLEL (llama.cpp's LLAMA_MAX_SEQ)
        description="Requests the API and the window answer at once (slots, each with its own "
        "context); default: the planner's choice, up to 4 where memory allows.",
    )
    temperature: float = Field(default=0.7, ge=0.0, le=2.0, description="Sampling temperature.")
    max_queue: int = Field(
        default=8, ge=1, le=256, description="Requests that may wait for the engine at once."
    )
    hub_endpoint: str = Field(
        default="https://huggingface.co",
        description="The model hub's address (https only) for search and downloads.",
    )
    hub_allow_insecure_loopback: bool = Field(
        default=False,
        description="For tests: allow plain http when hub_endpoint is a loopback IP address "
        "(127.0.0.1, ::1). It has no effect for any other host.",
    )
    hub_token: SecretStr | None = Field(
        default=None,
        description="Hub access token for private or gated repos; sent only to hub_endpoint.",
    )
