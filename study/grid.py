"""The runs of a study: one per routing mode, depth, block count (block modes only) and seed, each with its own
directory, named so that a finished run is found again and never confused with another."""

from dataclasses import asdict, dataclass
from pathlib import Path

from delta_qwen3.atomic import write_json
from finetune.presets import preset_fields
from modeling_delta_qwen3.routing_modes import BLOCK_MODES


@dataclass(frozen=True)
class Run:
    mode: str
    layers: int
    seed: int
    num_blocks: int | None = None  # block modes only

    @property
    def group(self) -> str:
        """The runs that differ only by seed: the unit the results report mean and spread of."""
        blocks = f"-b{self.num_blocks}" if self.num_blocks is not None else ""
        return f"{self.mode}{blocks}-L{self.layers}"

    @property
    def name(self) -> str:
        return f"{self.group}-s{self.seed}"

    def to_dict(self) -> dict:
        return asdict(self)


def expand_grid(modes: list[str], depths: list[int], seeds: list[int], block_counts: list[int]) -> list[Run]:
    """Every combination, ordered by depth, then mode, then seed: a study stopped part-way has whole groups of the
    shallower (cheaper) depths."""
    runs = []
    for layers in depths:
        for mode in modes:
            for num_blocks in block_counts if mode in BLOCK_MODES else [None]:
                runs.extend(Run(mode, layers, seed, num_blocks) for seed in seeds)
    return runs


def write_model_config(run: Run, preset: str, directory: Path) -> Path:
    """The run's Qwen3 shape: the preset's, with the run's depth (for `finetune --model-config`)."""
    path = directory / "model_config.json"
    write_json(path, {**preset_fields(preset), "num_hidden_layers": run.layers})
    return path
