"""Running the project's code: a command in this process, and code in a fresh interpreter where this project
cannot be imported."""

import io
import json
import os
import subprocess
import sys
import textwrap
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from delta_qwen3.cli import main

from .paths import PROJECT_PACKAGES, REPO_ROOT


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """`delta-qwen3 ARGV` in this process: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def isolated_env() -> dict:
    """The environment for a fresh interpreter: PYTHONPATH without this project, offline, deterministic."""
    env = dict(os.environ)
    entries = [Path(p).resolve() for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    kept = [str(p) for p in entries if p != REPO_ROOT]  # absolute: the subprocess runs elsewhere
    env["PYTHONPATH"] = os.pathsep.join(kept)
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONHASHSEED="0")
    return env


_BLOCK_PROJECT = f"""
import importlib.abc, sys
class _BlockProject(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {PROJECT_PACKAGES!r}:
            raise ImportError(f"{{name}} belongs to the project, which this process must not import")
sys.meta_path.insert(0, _BlockProject())
"""


def run_without_project(
    code: str, cwd: Path, timeout: int = 300, python: str | Path = sys.executable, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (`python`, by default this one; `env` is added to `isolated_env()`) in which
    none of this project's packages can be imported, the way a user who only has Transformers loads a checkpoint with
    `trust_remote_code=True`; with stdin closed, as in a batch job, so a question on the terminal fails instead of
    waiting. Raises with its output on failure."""
    script = _BLOCK_PROJECT + textwrap.dedent(code)
    result = subprocess.run(
        [str(python), "-c", script], cwd=cwd, env=isolated_env() | (env or {}), stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=timeout,
    )
    if result.returncode != 0:
        raise AssertionError(f"subprocess failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def last_json_line(stdout: str):
    """The last line of a subprocess's output, parsed as JSON: how isolated scripts report values."""
    return json.loads(stdout.strip().splitlines()[-1])
