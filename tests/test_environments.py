"""A test that needs an environment `make test` builds beside the main one fails where it is missing under `make
test` and CI (`DELTA_QWEN3_REQUIRE_ENVIRONMENTS`, which the Makefile sets), and is skipped elsewhere: one helper,
`helpers.environments.require_environment`, decides for every such test."""

import re
from pathlib import Path

import pytest
from helpers.environments import REQUIRED, require_environment
from helpers.paths import REPO_ROOT


def test_a_missing_environment_skips_a_plain_run(tmp_path, monkeypatch):
    monkeypatch.delenv(REQUIRED, raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"^no \.venv-gone: `make test` creates it$"):
        require_environment(tmp_path / ".venv-gone")


def test_a_missing_environment_fails_where_the_environments_are_required(tmp_path, monkeypatch):
    monkeypatch.setenv(REQUIRED, "1")
    with pytest.raises(pytest.fail.Exception, match=rf"^no \.venv-gone: `make test` creates it \({REQUIRED} is set"):
        require_environment(tmp_path / ".venv-gone")


@pytest.mark.parametrize("value", ["", "0"])
def test_an_empty_or_zero_setting_does_not_require_them(tmp_path, monkeypatch, value):
    monkeypatch.setenv(REQUIRED, value)
    with pytest.raises(pytest.skip.Exception):
        require_environment(tmp_path / ".venv-gone")


def test_a_complete_environment_runs_the_test(tmp_path, monkeypatch):
    monkeypatch.setenv(REQUIRED, "1")
    (tmp_path / ".venv-here").mkdir()
    (tmp_path / ".venv-here" / ".installed").touch()
    require_environment(tmp_path / ".venv-here")


def test_the_makefile_requires_the_environments_in_every_run_of_make_test():
    makefile = (REPO_ROOT / "Makefile").read_text()
    (pytest_line,) = re.findall(r"^PYTEST :=.*$", makefile, re.MULTILINE)
    assert f"{REQUIRED}=1 " in pytest_line


def test_no_test_decides_on_a_missing_environment_itself():
    """Every test that looks for an environment does it through `require_environment`, so that none skips under
    `make test`."""
    helper = REPO_ROOT / "tests" / "helpers" / "environments.py"
    environments = r"\b(VLLM_PYTHON|VLLM_PATH|FLA_PATH|OLDEST_PATH|NEWEST_TORCH_PATH)\b"
    own_checks = re.compile(rf"\.installed\b|{environments}.*\.exists\(\)"
                            r"|pytest\.(skip|mark\.skipif)\(.*(\.venv|`make test`)")
    deciding = [f"{path.relative_to(REPO_ROOT)}:{number}"
                for path in sorted((REPO_ROOT / "tests").rglob("*.py")) if path not in (helper, Path(__file__))
                for number, line in enumerate(path.read_text().splitlines(), 1) if own_checks.search(line)]  # fmt: skip
    assert not deciding
