"""Everything in a converted checkpoint besides the weights: config, model code, carried source files."""

import shutil
from pathlib import Path

from transformers.dynamic_module_utils import get_relative_import_files

import modeling_delta_qwen3.modeling_delta_qwen3 as modeling

from .source import CARRIED_FILES


def model_code_files() -> list[Path]:
    """The model package's Python files a checkpoint needs for `trust_remote_code=True`: the modeling file and
    everything it imports relatively, so a new module in the package is picked up."""
    modeling_file = Path(modeling.__file__)
    return [modeling_file, *sorted(Path(p) for p in get_relative_import_files(str(modeling_file)))]


def write_config_and_code(config, out_dir: Path) -> None:
    """`config.json` (with `auto_map`) and the model's Python files."""
    config.save_pretrained(out_dir)
    for file in model_code_files():
        shutil.copyfile(file, out_dir / file.name)


def copy_carried_files(src_dir: Path, out_dir: Path) -> list[str]:
    """Copy the tokenizer files, `generation_config.json` and license files that `src_dir` has; return their names.
    Symbolic links (as in the Hub cache) are followed."""
    carried = [name for name in CARRIED_FILES if (src_dir / name).is_file()]
    for name in carried:
        shutil.copyfile(src_dir / name, out_dir / name)
    return carried
