"""Where tooltrie keeps its files: one data directory per user, overridable."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

HOME_ENV = "TOOLTRIE_HOME"


def data_dir() -> Path:
    """The data directory: $TOOLTRIE_HOME if set, else the platform's user data dir."""
    override = os.environ.get(HOME_ENV)
    return Path(override) if override else Path(platformdirs.user_data_dir("tooltrie", appauthor=False))


def registry_dir() -> Path:
    return data_dir() / "registry"


def default_registry_db_url() -> str:
    return f"sqlite:///{registry_dir() / 'registry.db'}"


def admin_token_path() -> Path:
    """Where a registry started without configured tokens writes its generated admin token (mode 0600)."""
    return registry_dir() / "admin.token"
