"""Every option of a fine-tuning or pre-training run, in one dataclass; the command line is generated from it."""

import argparse
import math
from dataclasses import MISSING, asdict, dataclass, field, fields

from delta_qwen3.errors import CommandError
from modeling_delta_qwen3.routing_modes import GATEABLE_MODES, ROUTING_MODES

from .presets import PRESETS

MODES = ("baseline", *ROUTING_MODES)
DTYPES = ("float32", "bfloat16", "float16")
ROUTING_INITS = ("zero", "released")

# The options that say how one invocation runs, not what the run is: neither recorded nor compared on --resume.
INVOCATION_OPTIONS = frozenset({"resume", "overwrite", "stop_after_step", "trust_remote_code"})
# The keys under which a run's settings record what its options resolved to, with what each is called when it
# differs on --resume: the model configuration it trains, and what its data and tokenizer hold, so that a file moved
# elsewhere resumes and one changed in place does not.
MODEL_CONFIGURATION = "model_configuration"
DATA_CONTENT = "data_content"
TOKENIZER_CONTENT = "tokenizer_content"
RESOLVED_SETTINGS = {
    MODEL_CONFIGURATION: "the model configuration",
    DATA_CONTENT: "what the data holds",
    TOKENIZER_CONTENT: "the tokenizer's vocabulary, rules and special tokens",
}
# The options that may differ when a run is resumed: they change how long it goes on, what it reports and what it
# writes, never what is trained or on what. Every other option, one added later included, must stay as the run
# started. A new --max-steps also stretches the cosine schedule over the new length from the resumed step on.
RESUMABLE_OPTIONS = frozenset({
    "output_dir",  # the run directory may have been moved
    "model_config",  # so may the file: what it says is compared, as the model configuration
    "data", "tokenizer",  # so may these: what they hold is compared
    "max_steps",
    "log_every", "eval_every", "eval_batch_size", "report_to",
    "save_every", "keep_checkpoints", "save_dtype", "push_to_hub",
    "gradient_checkpointing",  # recomputes the same activations in the backward pass
})  # fmt: skip


def option(default, help: str, group: str, **argparse_kwargs):
    """A dataclass field that also describes its command-line option."""
    return field(default=default, metadata=dict(help=help, group=group, **argparse_kwargs))


@dataclass
class FinetuneConfig:
    """A run's configuration. Field `lr_routing` is the option `--lr-routing`, and so on."""

    # Model
    model: str | None = option(
        None, "DeltaQwen3 or Qwen3 checkpoint: a local directory or a Hub id (a Qwen3 one trains the baseline)", "model"
    )
    from_scratch: bool = option(False, "pre-train a new model instead of loading --model", "model")
    preset: str | None = option(None, "model shape for --from-scratch", "model", choices=sorted(PRESETS))
    model_config: str | None = option(
        None, "JSON file of Qwen3 configuration fields for --from-scratch, instead of --preset", "model"
    )
    mode: str | None = option(
        None,
        "baseline (plain Qwen3) or a routing mode; for --model it must match the checkpoint (default: the "
        "checkpoint's); required with --from-scratch",
        "model",
        choices=MODES,
    )
    num_blocks: int | None = option(
        None,
        "routing blocks of a block mode, with --from-scratch (default 4, or the number of layers if the model has fewer)",
        "model",
    )
    gate: bool = option(False, "zero-initialised gate per routing point, with --from-scratch (delta modes)", "model")
    routing_init: str = option(
        "zero",
        "the routing parameters of a new model, with --from-scratch: zero (queries 0, so every point starts with "
        "uniform weights; routing exempt from weight decay) or released (as the paper's released code: queries drawn "
        "from N(0, 0.02) and the routing parameters decayed like the matrices)",
        "model",
        choices=ROUTING_INITS,
    )
    tokenizer: str | None = option(
        None, "tokenizer directory or Hub id (default: --model's; required with --from-scratch)", "model"
    )
    gradient_checkpointing: bool = option(False, "recompute activations in the backward pass to save memory", "model")
    trust_remote_code: bool = option(
        False,
        "run Python code that the tokenizer ships (auto_map), as Transformers' trust_remote_code=True does; the model "
        "always loads with the installed DeltaQwen3 or Qwen3 classes",
        "model",
    )

    # What to train
    freeze_base: bool = option(
        False, "train only the routing parameters; the base weights stay bit-identical", "training"
    )
    lora: bool = option(
        False, "train LoRA adapters on the base's linear layers plus all routing parameters", "training"
    )
    lora_rank: int = option(16, "LoRA rank", "training")
    lora_alpha: float = option(32.0, "LoRA scaling numerator (the update is scaled by alpha / rank)", "training")
    lora_dropout: float = option(0.0, "dropout on the LoRA branch", "training")
    quantize: str | None = option(
        None,
        "with --lora, load --model quantised by bitsandbytes (4bit: QLoRA's NF4; 8bit) and train the adapters on it, "
        "the routing parameters in float32; the adapters, not a merged model, are saved (OUT/adapter)",
        "training",
        choices=("4bit", "8bit"),
    )

    # Data
    data: str | None = option(
        None,
        "Hub dataset id (streamed) or a local file or directory of them: a .txt file is one document, a .jsonl / "
        ".json file one document per line, a .parquet file one per row (see --val-blocks for what is held out)",
        "data",
        required=True,
    )
    data_config: str | None = option(None, "Hub dataset configuration, e.g. sample-10BT for FineWeb-Edu", "data")
    data_split: str = option("train", "Hub dataset split", "data")
    text_field: str = option("text", "field holding the text in JSON-lines, parquet and Hub data", "data")
    seq_len: int = option(1024, "tokens per packed training block", "data")
    val_blocks: int = option(
        64,
        "blocks of --seq-len tokens held out for validation, never trained on: whole documents (see "
        "--val-interval), or, when the data is one document (a single .txt file), its last --val-blocks x "
        "--seq-len tokens, training on the blocks before them",
        "data",
    )
    val_interval: int = option(
        10,
        "with data of several documents, every N-th document, from the first, is held out until --val-blocks are "
        "filled",
        "data",
    )
    shuffle_buffer: int = option(10_000, "documents in the streaming shuffle buffer (new order each epoch)", "data")
    block_shuffle_buffer: int = option(
        4096, "packed blocks in the shuffle buffer that mixes documents within a batch (1: packing order)", "data"
    )

    # Optimisation
    lr: float = option(3e-4, "peak learning rate", "optimisation")
    lr_routing: float | None = option(
        None, "peak learning rate of the routing parameters (default: --lr)", "optimisation"
    )
    weight_decay: float = option(
        0.1,
        "AdamW weight decay of matrices (norms, biases and routing are exempt; routing is not with --routing-init "
        "released)",
        "optimisation",
    )
    warmup_steps: int = option(100, "linear warm-up steps", "optimisation")
    min_lr_ratio: float = option(0.1, "the cosine schedule ends at this fraction of the peak rate", "optimisation")
    max_steps: int = option(1000, "optimiser steps", "optimisation")
    batch_size: int = option(8, "blocks per micro-batch per process", "optimisation")
    grad_accum: int = option(1, "micro-batches per optimiser step", "optimisation")
    max_grad_norm: float = option(
        1.0, "gradient clipping norm (0 disables clipping; the norm is still logged and checked)", "optimisation"
    )
    mixed_precision: str | None = option(
        None, "no, fp16 or bf16 (default: accelerate's configuration)", "optimisation", choices=("no", "fp16", "bf16")
    )
    seed: int = option(0, "seed of initialisation, LoRA and data order", "optimisation")

    # Logging and validation
    log_every: int = option(10, "steps between log lines", "logging")
    eval_every: int = option(
        200, "steps between validations (also run before the first and after the last step)", "logging"
    )
    eval_batch_size: int | None = option(None, "blocks per validation batch (default: --batch-size)", "logging")
    report_to: str = option(
        "none", "experiment tracker, through accelerate", "logging", choices=("none", "tensorboard", "wandb", "all")
    )

    # Outputs
    output_dir: str | None = option(
        None, "run directory: final model in OUT/model, checkpoints, log", "outputs", required=True
    )
    save_every: int = option(500, "steps between checkpoints (0: none)", "outputs")
    keep_checkpoints: int = option(2, "most recent checkpoints kept (0: all)", "outputs")
    resume: bool = option(
        False,
        "continue from the latest checkpoint in --output-dir (fresh start if none) with the options the run started "
        "with (OUT/run_config.json): only --max-steps, --gradient-checkpointing, logging and output options may change",
        "outputs",
    )
    overwrite: bool = option(False, "discard the checkpoints, log and model already in --output-dir", "outputs")
    stop_after_step: int | None = option(
        None,
        "end the process right after this step, saving nothing more, as if it had been killed (to test "
        "--resume, or to split a run into time-limited jobs with --save-every)",
        "outputs",
    )
    save_dtype: str = option("float32", "dtype of the saved final model", "outputs", choices=DTYPES)
    push_to_hub: str | None = option(None, "Hub repository to upload the final model to", "outputs")

    @property
    def routing_lr(self) -> float:
        return self.lr if self.lr_routing is None else self.lr_routing

    @property
    def released_routing(self) -> bool:
        """Whether the routing parameters start and decay as the paper's released code has them."""
        return self.routing_init == "released"

    @property
    def routing_weight_decay(self) -> float:
        return self.weight_decay if self.released_routing else 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    def validate(self) -> None:
        """Reject inconsistent options before anything is loaded."""
        if self.data is None or self.output_dir is None:
            raise CommandError("--data and --output-dir are required")
        if self.from_scratch == (self.model is not None):
            raise CommandError("give either --model or --from-scratch (with --preset or --model-config)")
        if self.from_scratch:
            if (self.preset is None) == (self.model_config is None):
                raise CommandError("--from-scratch needs exactly one of --preset or --model-config")
            if self.tokenizer is None:
                raise CommandError("--from-scratch needs --tokenizer (a tokenizer directory or Hub id)")
            if self.mode is None:
                raise CommandError(f"--from-scratch needs --mode, one of {', '.join(MODES)}")
            if self.gate and self.mode not in GATEABLE_MODES:
                raise CommandError(f"--gate needs a delta mode ({', '.join(GATEABLE_MODES)}), not --mode {self.mode}")
            if self.released_routing and self.mode == "baseline":
                raise CommandError("--routing-init released needs a routing mode: the baseline has no routing")
        elif self.preset or self.model_config or self.num_blocks is not None or self.gate or self.released_routing:
            raise CommandError("--preset, --model-config, --num-blocks, --gate and --routing-init only apply with "
                               "--from-scratch")  # fmt: skip
        if self.freeze_base and self.lora:
            raise CommandError("--freeze-base and --lora exclude each other")
        if self.quantize and not (self.lora and self.model):
            raise CommandError(f"--quantize {self.quantize} trains LoRA adapters on --model loaded quantised: it needs "
                               "--lora and --model (not --from-scratch)")  # fmt: skip
        if self.resume and self.overwrite:
            raise CommandError("--resume and --overwrite exclude each other")
        if self.seq_len < 2:
            raise CommandError(f"--seq-len must be at least 2 (one prediction needs two tokens), got {self.seq_len}")
        positive = ("val_blocks", "max_steps", "batch_size", "grad_accum", "log_every", "eval_every", "lora_rank",
                    "shuffle_buffer", "val_interval", "block_shuffle_buffer")  # fmt: skip
        for name in positive:
            if getattr(self, name) < 1:
                raise CommandError(f"{flag(name)} must be at least 1, got {getattr(self, name)}")
        if self.warmup_steps < 0 or self.save_every < 0 or self.keep_checkpoints < 0:
            raise CommandError("--warmup-steps, --save-every and --keep-checkpoints must not be negative")
        for name in ("eval_batch_size", "stop_after_step", "num_blocks"):  # where given
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise CommandError(f"{flag(name)} must be at least 1, got {getattr(self, name)}")
        check_seed(self.seed, "--seed")
        self._validate_numbers()

    def _validate_numbers(self) -> None:
        """NaN passes every comparison, so a NaN rate would train to the end on NaN weights: every number must be
        finite, the rates and norms non-negative, and the schedule's floor a fraction of the peak."""
        for spec in fields(self):
            value = getattr(self, spec.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise CommandError(f"{flag(spec.name)} must be a finite number, got {value}")
        for name in ("lr", "lr_routing", "weight_decay", "max_grad_norm"):
            if (getattr(self, name) or 0) < 0:
                raise CommandError(f"{flag(name)} must not be negative, got {getattr(self, name)}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise CommandError(f"--min-lr-ratio must be between 0 and 1 (a fraction of the peak rate), got "
                               f"{self.min_lr_ratio}")  # fmt: skip
        if not 0 <= self.lora_dropout < 1:
            raise CommandError(f"--lora-dropout must be at least 0 and below 1 (a probability), got "
                               f"{self.lora_dropout}")  # fmt: skip
        if self.lora_alpha <= 0:
            raise CommandError(f"--lora-alpha must be positive (the update is scaled by alpha / rank), got "
                               f"{self.lora_alpha}")  # fmt: skip


SEEDS = range(2**32)  # what every generator a run seeds (Python's, NumPy's, PyTorch's) takes


def check_seed(seed: int, option: str) -> None:
    """Refuse a seed that NumPy's generator, which accelerate seeds with it, does not take."""
    if seed not in SEEDS:
        raise CommandError(f"{option} must be between 0 and {SEEDS.stop - 1}, got {seed}")


def flag(name: str) -> str:
    """The command-line option of field `name`."""
    return "--" + name.replace("_", "-")


def _config_changes(old: dict, new: dict) -> list[str]:
    """`"name OLD -> NEW"` for each entry that differs between two model configurations; the name alone where a
    value is a list or a mapping, too long for one line."""
    changes = []
    for key in sorted(old.keys() | new.keys()):
        before, after = old.get(key, "(not set)"), new.get(key, "(not set)")
        if before != after:
            nested = isinstance(before, (dict, list)) or isinstance(after, (dict, list))
            changes.append(key if nested else f"{key} {before} -> {after}")
    return changes


def resume_changes(saved: dict, current: dict) -> tuple[list[str], list[str]]:
    """The settings of a run (its options, `num_processes` and the resolved model configuration) that differ
    between the start of the run (`saved`) and its resumption (`current`), as `(refused, allowed)` lists of
    `"--name OLD -> NEW"` (the model configuration as one entry); allowed are those in `RESUMABLE_OPTIONS`. An
    option that `saved` does not record came after the run started, which therefore ran as its default does."""
    defaults = {spec.name: spec.default for spec in fields(FinetuneConfig)}
    refused, allowed = [], []
    for name in sorted(saved.keys() | current.keys()):
        old, new = saved.get(name, defaults.get(name, "(not recorded)")), current.get(name, "(not recorded)")
        if old == new:
            continue
        if name == MODEL_CONFIGURATION and isinstance(old, dict) and isinstance(new, dict):
            refused.append(f"model configuration ({'; '.join(_config_changes(old, new))})")
        elif name in RESOLVED_SETTINGS:
            refused.append(f"{RESOLVED_SETTINGS[name]} ({old} -> {new})")
        else:
            label = "number of processes" if name == "num_processes" else flag(name)
            (allowed if name in RESUMABLE_OPTIONS else refused).append(f"{label} {old} -> {new}")
    return refused, allowed


def build_parser() -> argparse.ArgumentParser:
    """The command line, one option per `FinetuneConfig` field, grouped as in the dataclass."""
    parser = argparse.ArgumentParser(
        prog="finetune",
        description="Fine-tune a DeltaQwen3 (or Qwen3) checkpoint, or pre-train one from scratch, with accelerate.",
        argument_default=argparse.SUPPRESS,
    )
    groups: dict[str, argparse._ArgumentGroup] = {}
    for spec in fields(FinetuneConfig):
        meta = dict(spec.metadata)
        group = groups.setdefault(meta.pop("group"), parser.add_argument_group(spec.metadata["group"]))
        if spec.type is bool:
            group.add_argument(flag(spec.name), action="store_true", **meta)
            continue
        kind = str(spec.type)
        value_type = int if "int" in kind else float if "float" in kind else str
        default = "" if spec.default is MISSING or spec.default is None else f" (default: {spec.default})"
        meta["help"] = meta["help"] + (default if "default" not in meta["help"] else "")
        group.add_argument(flag(spec.name), type=value_type, **meta)
    return parser


def parse_args(argv: list[str] | None = None) -> FinetuneConfig:
    """Parse the command line into a validated `FinetuneConfig`."""
    config = FinetuneConfig(**vars(build_parser().parse_args(argv)))
    config.validate()
    return config
