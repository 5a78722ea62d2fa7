"""What may import what among the project's tools: no benchmark imports the demo, no test helper imports the
benchmarks (what both need lives in the installed packages), and the GPU check keeps one module per section."""

import ast
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT

from benchmarks.gpu_check.driver import SECTIONS


def imported_packages(path: Path) -> set[str]:
    """The top-level packages that the module in `path` imports, anywhere in it (inside functions too)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return {name.split(".")[0] for name in names}


@pytest.mark.parametrize("folder,forbidden", [("benchmarks", "demo"), ("tests/helpers", "benchmarks")])
def test_no_module_of_the_folder_imports_the_forbidden_package(folder, forbidden):
    importing = [str(path.relative_to(REPO_ROOT)) for path in sorted((REPO_ROOT / folder).rglob("*.py"))
                 if forbidden in imported_packages(path)]  # fmt: skip
    assert not importing, f"{', '.join(importing)} import {forbidden}"


def test_imported_packages_sees_imports_inside_functions(tmp_path):
    module = tmp_path / "module.py"
    module.write_text("import os\n\ndef f():\n    from demo.journey import run\n    from . import sibling\n")
    assert imported_packages(module) == {"os", "demo"}


def test_the_gpu_check_has_a_module_per_section():
    package = REPO_ROOT / "benchmarks" / "gpu_check"
    assert [name for name in SECTIONS if not (package / f"{name}.py").is_file()] == []
