"""Engine fixtures: every test taking ``engine_name`` runs once per engine (the CUDA engine joins this list)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from decoder_service.engines.base import Engine
from decoder_service.engines.catalog import PreparedCatalog, Tool
from decoder_service.engines.factory import ENGINE_NAMES, make_engine
from decoder_service.engines.prompt import prepare_catalog
from decoder_service.model_runtime import _cuda_unusable_reason
from decoder_service.models.tokenizer_source import chat_template, model_tokenizer

# Names sharing prefixes, one name a prefix of another ("get" / "get_file"), and a dotted namespace.
TOOLS = [
    Tool("github.create_issue", "Open a new issue in a GitHub repository."),
    Tool("github.list_issues", "List the issues of a GitHub repository."),
    Tool("slack.send_message", "Post a message to a Slack channel."),
    Tool("slack.search", "Search Slack messages."),
    Tool("calendar.create_event", "Create a calendar event."),
    Tool("get", "Fetch a URL."),
    Tool("get_file", "Read a file from the workspace."),
    Tool("drive.upload", "Upload a file to the shared drive."),
]


_CUDA_SKIP = _cuda_unusable_reason()
# The CUDA engine runs wherever a GPU and the cubin are usable and is skipped elsewhere.
ENGINE_PARAMS = [
    pytest.param(name, marks=pytest.mark.skipif(_CUDA_SKIP is not None, reason=f"CUDA engine unusable: {_CUDA_SKIP}"))
    if name == "cuda"
    else name
    for name in dict.fromkeys((*ENGINE_NAMES, "cuda"))
]


@pytest.fixture(params=ENGINE_PARAMS)
def engine_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def make_tiny_engine(engine_name: str, tiny_model) -> Callable[..., Engine]:
    def make(head: str = "sparse", forced_tail: bool = True, forced_chains: bool = True) -> Engine:
        return make_engine(engine_name, *tiny_model, head=head, forced_tail=forced_tail, forced_chains=forced_chains)

    return make


def prepare_tiny_catalog(tiny_dir: Path) -> PreparedCatalog:
    """TOOLS prepared for the tiny model (also called by the GPU module, which runs without conftest fixtures)."""
    return prepare_catalog(
        TOOLS,
        model_tokenizer(tiny_dir),
        chat_template(tiny_dir),
        context_length=4096,
        catalog_id="test-tools",
        version=3,
    )


@pytest.fixture(scope="session")
def tiny_catalog(tiny_dir: Path) -> PreparedCatalog:
    return prepare_tiny_catalog(tiny_dir)
