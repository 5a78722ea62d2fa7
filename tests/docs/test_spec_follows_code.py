"""docs/SPEC.md, the contract, follows the code: what the code declares is read from the code itself and looked for
in the section of SPEC that specifies it, so that the next routing mode, routing implementation, Auto class,
configuration field, model method or command-line verb or option cannot be added undocumented.

- every routing mode (`routing_modes.ROUTING_MODES`): its formula in section 2 (`routing_mode = "NAME"`), its name
  in section 3 and in the configuration's docstring;
- every routing implementation (`routing.IMPLEMENTATIONS`): in section 3 and in the configuration's docstring;
- every field the configuration adds to Qwen3's: a row of section 3's table with the field's default, and the
  docstring's `defaults to` equal to the code's;
- every Auto class in the `auto_map` that a saved checkpoint's config.json holds, with its class: in section 4;
- every method the model classes add to Transformers' and every argument their `forward` adds to Qwen3's: in
  section 5;
- every `delta-qwen3` verb (the forms its usage names, such as `eval export-data`, too) and every option and
  positional argument of each, and every `python -m finetune` option: in that command's part of section 6.

The last tests add a mode, an implementation, an Auto class, a verb and an option to the code, and see each
reported."""

import argparse
import inspect
import json
import re
import sys
import types

import pytest
import torch
from helpers.models import delta_config
from helpers.paths import REPO_ROOT
from transformers import GenerationMixin, PreTrainedModel, Qwen3Config, Qwen3ForCausalLM, Qwen3Model

from modeling_delta_qwen3 import configuration_delta_qwen3, modeling_delta_qwen3
from modeling_delta_qwen3.configuration_delta_qwen3 import DeltaQwen3Config
from modeling_delta_qwen3.routing import IMPLEMENTATIONS
from modeling_delta_qwen3.routing_modes import ROUTING_MODES

SPEC = REPO_ROOT / "docs" / "SPEC.md"
FINETUNE = "python -m finetune"
HEADING = re.compile(r"^## (\d+)\. ", re.MULTILINE)
SUBHEADING = re.compile(r"^### (.*)$", re.MULTILINE)


def spec_sections() -> dict[str, str]:
    """SPEC's numbered sections by number, each without its subsections' split."""
    text = SPEC.read_text()
    starts = list(HEADING.finditer(text))
    return {match.group(1): text[match.start(): following.start() if following else len(text)]
            for match, following in zip(starts, [*starts[1:], None])}  # fmt: skip


def subsections(section: str) -> dict[str, str]:
    """A section's `###` subsections by heading, each with its text."""
    starts = list(SUBHEADING.finditer(section))
    return {match.group(1): section[match.start(): following.start() if following else len(section)]
            for match, following in zip(starts, [*starts[1:], None])}  # fmt: skip


def mentions(text: str, word: str) -> bool:
    """`word` stands in `text` as a whole word or option: `--data` is not found in `--data-dir`."""
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


def quoted(text: str, name: str) -> bool:
    """`name` stands in `text` as code or a string: `` `name` `` or `"name"`."""
    return f"`{name}`" in text or f'"{name}"' in text


def as_json(value) -> str:
    return json.dumps(value)


# --- what the code declares ---------------------------------------------------------------------------------------


def own_config_fields() -> dict[str, object]:
    """The fields DeltaQwen3Config adds to Qwen3Config, with their defaults."""
    return {name: getattr(DeltaQwen3Config, name) for name in DeltaQwen3Config.__annotations__
            if name not in getattr(Qwen3Config, "__annotations__", {})}  # fmt: skip


def saved_auto_map(tmp_path) -> dict[str, str]:
    """The `auto_map` of the config.json that saving a tiny DeltaQwen3ForCausalLM writes."""
    modeling_delta_qwen3.DeltaQwen3ForCausalLM(delta_config()).save_pretrained(tmp_path / "saved")
    return json.loads((tmp_path / "saved" / "config.json").read_text())["auto_map"]


def model_classes() -> list[type]:
    return [value for value in vars(modeling_delta_qwen3).values()
            if isinstance(value, type) and issubclass(value, PreTrainedModel)
            and value.__module__ == modeling_delta_qwen3.__name__]  # fmt: skip


def own_model_methods() -> set[str]:
    """The public methods that the model classes define and Transformers' models and modules do not have."""
    transformers_classes = (PreTrainedModel, GenerationMixin, torch.nn.Module)
    ours = {klass for cls in model_classes() for klass in cls.__mro__
            if klass.__module__ == modeling_delta_qwen3.__name__}  # fmt: skip
    return {name for klass in ours for name, value in vars(klass).items()
            if not name.startswith("_") and callable(value)
            and not any(hasattr(base, name) for base in transformers_classes)}  # fmt: skip


def own_forward_arguments() -> set[str]:
    """The arguments that the models' `forward` names and Qwen3's does not (where Qwen3 takes them as `**kwargs`, or
    not at all)."""
    pairs = [(modeling_delta_qwen3.DeltaQwen3ForCausalLM, Qwen3ForCausalLM),
             (modeling_delta_qwen3.DeltaQwen3Model, Qwen3Model)]  # fmt: skip
    return {name for ours, theirs in pairs for name in inspect.signature(ours.forward).parameters
            if name not in inspect.signature(theirs.forward).parameters}  # fmt: skip


def subparsers_of(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def arguments(parser: argparse.ArgumentParser) -> list[str]:
    """The option strings of a parser, and its positional arguments by metavar, but not `--help`."""
    found = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.option_strings:
            found += [option for option in action.option_strings if option not in ("-h", "--help")]
        elif isinstance(action.metavar, str) and action.nargs != argparse.REMAINDER:
            found.append(action.metavar)
    return found


def usage_forms(program: str, verb: str, parser: argparse.ArgumentParser) -> list[str]:
    """The further verbs that a verb's own usage names (`delta-qwen3 eval export-data DIR`): a lower-case word right
    after the verb."""
    forms = re.findall(rf"{re.escape(program)} {re.escape(verb)} ([a-z][a-z-]*)", parser.usage or "")
    return [f"{verb} {form}" for form in forms]


def commands() -> dict[str, tuple[argparse.ArgumentParser, list[str]]]:
    """Every command of the project's command line, by how SPEC names it: its parser and its arguments."""
    from delta_qwen3.cli import build_parser
    from finetune.config import build_parser as finetune_parser

    found = {}
    for verb, parser in subparsers_of(build_parser()).items():
        found[f"delta-qwen3 {verb}"] = (parser, arguments(parser))
        for form in usage_forms("delta-qwen3", verb, parser):
            found[f"delta-qwen3 {form}"] = (parser, [])  # its options are the verb's
    found[FINETUNE] = (finetune_parser(), arguments(finetune_parser()))
    return found


# --- where SPEC says it -------------------------------------------------------------------------------------------


def not_named(kind: str, name: str) -> list[str]:
    """Where a routing mode or implementation `name` must be named and is not: SPEC section 3 and the
    configuration's docstring."""
    places = {"SPEC section 3": spec_sections()["3"], "DeltaQwen3Config's docstring": DeltaQwen3Config.__doc__}
    return [f"{kind} {name}: not in {where}" for where, text in places.items() if not quoted(text, name)]


def undocumented_modes() -> list[str]:
    missing = []
    for mode in ROUTING_MODES:
        if f'routing_mode = "{mode}"' not in spec_sections()["2"]:
            missing.append(f"routing mode {mode}: no formula in SPEC section 2")
        missing += not_named("routing mode", mode)
    return missing


def undocumented_implementations() -> list[str]:
    return [line for name in IMPLEMENTATIONS for line in not_named("routing implementation", name)]


def undocumented_fields() -> list[str]:
    """Each added field: a row of section 3's table whose default cell is the code's default (as JSON), and in the
    docstring's Args, with `defaults to` equal to the code's where it says one."""
    rows = {cells[0].strip("` "): [cell.strip() for cell in cells]
            for cells in (line.strip("|").split("|") for line in spec_sections()["3"].splitlines()
                          if line.startswith("| `"))}  # fmt: skip
    docstring = DeltaQwen3Config.__doc__
    missing = []
    for name, default in own_config_fields().items():
        if name not in rows:
            missing.append(f"configuration field {name}: no row in SPEC section 3's table")
        elif rows[name][2].strip("`") != as_json(default):
            missing.append(f"configuration field {name}: SPEC section 3 says the default is {rows[name][2]}, the code "
                           f"{as_json(default)}")
        documented = re.search(rf"^\s*{name} \((.*)\):$", docstring, re.MULTILINE)
        if documented is None:
            missing.append(f"configuration field {name}: not in DeltaQwen3Config's docstring")
            continue
        said = re.search(r"defaults to `([^`]*)`", documented.group(1))
        expected = as_json(default) if isinstance(default, str) else str(default)
        if said is not None and said.group(1) != expected:
            missing.append(f"configuration field {name}: the docstring says the default is {said.group(1)}, the "
                           f"code {expected}")
    return missing


def undocumented_auto_classes(auto_map: dict[str, str]) -> list[str]:
    section = spec_sections()["4"]
    return [f"auto_map {auto_class}: {target} not in SPEC section 4" for auto_class, target in auto_map.items()
            if not (quoted(section, auto_class) and mentions(section, target.rsplit(".", 1)[-1]))]  # fmt: skip


def undocumented_model_api() -> list[str]:
    section = spec_sections()["5"]
    return [f"model API {name}: not in SPEC section 5" for name in sorted(own_model_methods() | own_forward_arguments())
            if not mentions(section, name)]  # fmt: skip


def command_parts() -> list[tuple[list[str], str]]:
    """Section 6's subsections: the commands each one's heading names (its code spans), and its text."""
    return [(re.findall(r"`([^`]+)`", heading), text) for heading, text in subsections(spec_sections()["6"]).items()]


def command_part(command: str, parts: list[tuple[list[str], str]]) -> str | None:
    """The part of section 6 for `command`: the subsections whose heading names `command`, alone or with its
    arguments; None where none does."""
    texts = [text for names, text in parts if any(name == command or name.startswith(command + " ") for name in names)]
    return "\n".join(texts) if texts else None


def undocumented_commands() -> list[str]:
    section, parts = spec_sections()["6"], command_parts()
    missing = []
    for command, (_, options) in commands().items():
        if not mentions(section, command):
            missing.append(f"{command}: not in SPEC section 6")
        part = command_part(command, parts)
        if part is None:
            missing.append(f"{command}: no subsection of SPEC section 6 whose heading names it")
            continue
        missing += [f"{command} {option}: not in its part of SPEC section 6" for option in options
                    if not mentions(part, option)]  # fmt: skip
    return missing


# --- the tests ----------------------------------------------------------------------------------------------------


def test_every_routing_mode_is_specified():
    assert undocumented_modes() == []


def test_every_routing_implementation_is_specified():
    assert undocumented_implementations() == []


def test_every_configuration_field_is_specified_with_its_default():
    assert undocumented_fields() == []


def test_every_auto_class_a_checkpoint_names_is_specified(tmp_path):
    auto_map = saved_auto_map(tmp_path)
    assert auto_map == configuration_delta_qwen3.AUTO_MAP
    assert undocumented_auto_classes(auto_map) == []


def test_every_method_and_forward_argument_the_models_add_is_specified():
    assert "set_routing_implementation" in own_model_methods()
    assert "output_routing_weights" in own_forward_arguments()
    assert undocumented_model_api() == []


def test_every_command_and_option_is_specified():
    assert {"delta-qwen3 convert", "delta-qwen3 eval export-data", FINETUNE} <= set(commands())
    assert "--lora-rank" in commands()[FINETUNE][1] and "SRC" in commands()["delta-qwen3 convert"][1]
    assert undocumented_commands() == []


# --- the checks report what is added undocumented -----------------------------------------------------------------


def test_a_mode_added_without_its_spec_is_reported(monkeypatch):
    monkeypatch.setitem(ROUTING_MODES, "delta_sparse", ROUTING_MODES["delta"])
    assert [line for line in undocumented_modes() if "delta_sparse" in line] == [
        "routing mode delta_sparse: no formula in SPEC section 2",
        "routing mode delta_sparse: not in SPEC section 3",
        "routing mode delta_sparse: not in DeltaQwen3Config's docstring",
    ]


def test_an_implementation_added_without_its_spec_is_reported(monkeypatch):
    monkeypatch.setitem(IMPLEMENTATIONS, "chunked", IMPLEMENTATIONS["reference"])
    assert [line for line in undocumented_implementations() if "chunked" in line] == [
        "routing implementation chunked: not in SPEC section 3",
        "routing implementation chunked: not in DeltaQwen3Config's docstring",
    ]


def test_an_auto_class_added_without_its_spec_is_reported(monkeypatch, tmp_path):
    target = "modeling_delta_qwen3.DeltaQwen3ForMultipleChoice"
    monkeypatch.setitem(configuration_delta_qwen3.AUTO_MAP, "AutoModelForMultipleChoice", target)
    assert [line for line in undocumented_auto_classes(saved_auto_map(tmp_path)) if "MultipleChoice" in line] == [
        f"auto_map AutoModelForMultipleChoice: {target} not in SPEC section 4"]


def test_a_verb_or_an_option_added_without_its_spec_is_reported(monkeypatch):
    def register(subparsers) -> None:
        subparsers.add_parser("merge").add_argument("--weights")
        convert = subparsers.choices["convert"]
        convert.add_argument("--shard-size")

    from delta_qwen3 import cli

    module = types.ModuleType("extra_verbs")
    module.register = register
    monkeypatch.setitem(sys.modules, "extra_verbs", module)
    monkeypatch.setattr(cli, "SUBCOMMAND_MODULES", (*cli.SUBCOMMAND_MODULES, "extra_verbs"))
    assert [line for line in undocumented_commands() if "merge" in line or "--shard-size" in line] == [
        "delta-qwen3 convert --shard-size: not in its part of SPEC section 6",
        "delta-qwen3 merge: not in SPEC section 6",
        "delta-qwen3 merge: no subsection of SPEC section 6 whose heading names it",
    ]


def test_mentions_finds_whole_words_and_options_only():
    assert mentions("`--data-dir DIR`, `--data PATH`", "--data")
    assert not mentions("`--data-dir DIR`", "--data")
    assert mentions("(`delta-qwen3 eval MODEL`)", "delta-qwen3 eval")
    assert not mentions("`delta-qwen3 eval-all`", "delta-qwen3 eval")


@pytest.mark.parametrize("default,expected", [("delta_block", '"delta_block"'), (4, "4"), (False, "false"),
                                              (None, "null")])  # fmt: skip
def test_defaults_are_compared_as_json(default, expected):
    assert as_json(default) == expected
