"""The environments that `make test` builds beside the main one, and what a test that needs one does where it is
missing: under `make test` and CI, which set `DELTA_QWEN3_REQUIRE_ENVIRONMENTS=1`, it fails, so that a missing
environment cannot pass for a green run; elsewhere (a plain `pytest`) it is skipped, saying so."""

import os
from pathlib import Path

import pytest

REQUIRED = "DELTA_QWEN3_REQUIRE_ENVIRONMENTS"


def environments_required() -> bool:
    return os.environ.get(REQUIRED, "") not in ("", "0")


def require_environment(path: Path) -> None:
    """Go on when the environment in `path` is complete (the `.installed` file that `make` writes last is there);
    else fail or skip, as above."""
    if (path / ".installed").exists():
        return
    message = f"no {path.name}: `make test` creates it"
    if environments_required():
        pytest.fail(f"{message} ({REQUIRED} is set: the tests that need it must run)", pytrace=False)
    pytest.skip(message)
