"""The commands the READMEs show exist: every fenced shell command that runs a program of this project is parsed by
that program's own argparse parser (no subprocess), so an option renamed in the code, or mistyped in a README,
fails here. `make` commands need their target, and the variables they set, in the Makefile."""

import argparse
import functools
import importlib
import importlib.util
import re
import shlex
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from accelerate.commands.launch import launch_command_parser
from helpers.paths import PROJECT_PACKAGES, REPO_ROOT

DOCUMENTS = ("README.md", *sorted(f"docs/{page.name}" for page in (REPO_ROOT / "docs").glob("*.md")),
             "benchmarks/README.md")
SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
COMMAND_SEPARATORS = {"&&", "||", ";", "|"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
MAKE_RULE = re.compile(r"^([A-Za-z0-9_.$()/ -]+?)\s*:(?!=)", re.MULTILINE)


@dataclass(frozen=True)
class Command:
    """One command of a README's shell block: where it starts, and its words after any environment assignments."""

    where: str
    argv: tuple[str, ...]


def _logical_lines(block: str, first_line: int) -> Iterator[tuple[int, str]]:
    """The lines of a shell block with backslash continuations joined, each with the number of its first line."""
    pending, start = "", first_line
    for number, line in enumerate(block.splitlines(), start=first_line):
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        yield start, pending + line
        pending = ""


def _split_commands(words: list[str]) -> Iterator[tuple[str, ...]]:
    """The commands of one line's words, split at `&&`, `||`, `;` and `|`, without leading `NAME=value`s."""
    command: list[str] = []
    for word in [*words, ";"]:
        if word not in COMMAND_SEPARATORS:
            command.append(word)
            continue
        while command and ASSIGNMENT.match(command[0]):
            command.pop(0)
        if command:
            yield tuple(command)
        command = []


def shell_commands(text: str, document: str) -> list[Command]:
    """Every command of the fenced shell blocks of `text` (Markdown), comments dropped."""
    commands = []
    for fence in FENCE.finditer(text):
        if fence.group(1) in SHELL_LANGUAGES:
            first_line = text.count("\n", 0, fence.start(2)) + 1
            for number, line in _logical_lines(fence.group(2), first_line):
                commands += [Command(f"{document}:{number}", argv)
                             for argv in _split_commands(shlex.split(line, comments=True))]
    return commands


class _Parsed(Exception):
    """Raised by `parse_args` once it has parsed, so that a script's `main` stops before doing any work."""


def _parse_with_script_main(module_name: str, argv: list[str]) -> None:
    """Parse `argv` as the benchmark script `module_name` does: through its `main`, which builds the parser and
    is stopped as soon as the command line is parsed."""
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        original(self, args, namespace)
        raise _Parsed

    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(REPO_ROOT / "benchmarks"))  # as when run as a script: its folder is on the path
        module = importlib.import_module(module_name)
        patch.setattr(sys, "argv", [module_name, *argv])
        patch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
        with pytest.raises(_Parsed):
            module.main()


def _parse_delta_qwen3(argv: list[str]) -> None:
    from delta_qwen3.cli import build_parser

    build_parser().parse_args(argv)


def _parse_finetune(argv: list[str]) -> None:
    from finetune.config import build_parser

    build_parser().parse_args(argv)


def _parse_demo(argv: list[str]) -> None:
    from demo.__main__ import parse_settings

    parse_settings(argv)


def _parse_gpu_check(argv: list[str]) -> None:
    from benchmarks.gpu_check.driver import build_parser

    build_parser().parse_args(argv)


Parser = Callable[[list[str]], None]
# `python -m NAME` for the project's runnable packages and modules.
MODULES: dict[str, Parser] = {"finetune": _parse_finetune, "demo": _parse_demo,
                              "benchmarks.gpu_check": _parse_gpu_check,
                              "benchmarks.decode_steps": functools.partial(_parse_with_script_main,
                                                                           "benchmarks.decode_steps")}


def _python_module(command: Command, module: str, args: list[str]) -> tuple[str, Parser, list[str]] | None:
    if module not in PROJECT_PACKAGES and module not in MODULES and importlib.util.find_spec(module) is not None:
        return None  # an installed tool: pytest and the like
    if module not in MODULES:
        pytest.fail(f"{command.where}: `python -m {module}` is not a runnable module of this project")
    return f"python -m {module}", MODULES[module], args


def _python_script(command: Command, script: str, args: list[str]) -> tuple[str, Parser, list[str]]:
    path = REPO_ROOT / script
    if not path.is_file() or path.parent != REPO_ROOT / "benchmarks":
        pytest.fail(f"{command.where}: {script} is not a script of this project's benchmarks/")
    return script, functools.partial(_parse_with_script_main, path.stem), args


def project_program(command: Command) -> tuple[str, Parser, list[str]] | None:
    """The project program that `command` runs, its parser and its arguments; None for other programs (pip,
    lm_eval). Fails for a project module or script that does not exist or has no known parser; `accelerate launch`
    parses its own options here, and exits as argparse does when they are wrong."""
    name, *args = command.argv
    if name == "delta-qwen3":
        return name, _parse_delta_qwen3, args
    if name == "accelerate" and args[:1] == ["launch"]:
        launched = launch_command_parser().parse_args(args[1:])
        launch = _python_module if launched.module else _python_script
        return launch(command, launched.training_script, launched.training_script_args)
    if re.fullmatch(r"(.*/)?python3?", name) and args:
        if args[0] == "-m":
            return _python_module(command, args[1], args[2:])
        return _python_script(command, args[0], args[1:])
    return None


def _check_make(command: Command) -> None:
    makefile = (REPO_ROOT / "Makefile").read_text()
    targets = {target for rule in MAKE_RULE.findall(makefile) for target in rule.split()}
    for word in command.argv[1:]:
        if ASSIGNMENT.match(word):
            name = word.split("=", 1)[0]
            assert f"$({name})" in makefile, f"{command.where}: the Makefile does not read {name}"
        else:
            assert word in targets, f"{command.where}: the Makefile has no target {word!r}"


@pytest.fixture
def exact_options(monkeypatch):
    """Parsers that take only whole option names: a README's `--lora-r` must not pass as an abbreviation of
    `--lora-rank`, nor `--lora-rank` once the code has renamed it to `--lora-ranks`."""
    original = argparse.ArgumentParser.__init__

    def without_abbreviations(self, *args, **kwargs):
        original(self, *args, **{**kwargs, "allow_abbrev": False})

    monkeypatch.setattr(argparse.ArgumentParser, "__init__", without_abbreviations)


COMMANDS = [command for document in DOCUMENTS
            for command in shell_commands((REPO_ROOT / document).read_text(), document)]


@pytest.mark.parametrize("command", COMMANDS, ids=[command.where for command in COMMANDS])
def test_readme_command_parses_with_the_programs_own_parser(command, capsys, exact_options):
    if command.argv[0] == "make":
        _check_make(command)
        return
    try:
        program = project_program(command)
        if program is not None:
            _, parse, args = program
            parse(args)
    except SystemExit as exit:
        if exit.code:
            pytest.fail(f"{command.where}: `{shlex.join(command.argv)}` is refused:\n{capsys.readouterr().err}")


def test_readmes_show_every_kind_of_project_command():
    """The extraction finds the commands the READMEs are known to hold, so it cannot silently find none."""
    programs = [project_program(command) for command in COMMANDS if command.argv[0] != "make"]
    assert {"delta-qwen3", "python -m finetune", "benchmarks/routing_overhead.py", "python -m benchmarks.decode_steps",
            "benchmarks/convert_memory.py", "benchmarks/data_mixing.py"} <= {
        program[0] for program in programs if program
    }
    assert len([command for command in COMMANDS if command.argv[:2] == ("accelerate", "launch")]) >= 4
    assert {"demo", "test"} <= {command.argv[1] for command in COMMANDS if command.argv[0] == "make"}


def test_shell_commands_join_continuations_and_drop_comments():
    text = (
        "```bash\n"
        "# a comment line\n"
        "delta-qwen3 convert SRC OUT \\\n"
        "    --mode delta   # what follows is a comment\n"
        "HF_HUB_OFFLINE=1 make demo && make test\n"
        "```\n"
        "```python\n"
        "print('not shell')\n"
        "```\n"
    )
    assert shell_commands(text, "doc") == [
        Command("doc:3", ("delta-qwen3", "convert", "SRC", "OUT", "--mode", "delta")),
        Command("doc:5", ("make", "demo")),
        Command("doc:5", ("make", "test")),
    ]


def test_an_option_the_program_lacks_is_refused(capsys, exact_options):
    """What a README command with a renamed option meets: the program's own refusal, also for a prefix of a real
    option."""
    command = Command("doc:1", ("accelerate", "launch", "-m", "finetune", "--data", "D", "--output-dir", "O",
                                "--learning-rate", "1", "--lora-r", "16"))
    name, parse, args = project_program(command)
    with pytest.raises(SystemExit) as exit:
        parse(args)
    assert (name, exit.value.code) == ("python -m finetune", 2)
    assert "unrecognized arguments: --learning-rate 1 --lora-r 16" in capsys.readouterr().err


def test_readme_cites_the_papers_as_the_model_card_does():
    from conversion.model_card import ATTNRES_BIBTEX, DELTA_ATTNRES_BIBTEX

    readme = (REPO_ROOT / "README.md").read_text()
    assert f"```bibtex\n{DELTA_ATTNRES_BIBTEX}\n\n{ATTNRES_BIBTEX}\n```" in readme
