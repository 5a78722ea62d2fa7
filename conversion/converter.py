"""Qwen3 checkpoint -> DeltaQwen3 checkpoint: read and check the source, then stream it into a staged output."""

from pathlib import Path

import torch

from delta_qwen3.atomic import staged_directory
from delta_qwen3.output_paths import output_lock, reporting_write_failure

from .model_card import card_license, conversion_description, write_model_card
from .output_dir import check_not_nested, check_target
from .output_files import copy_carried_files, write_config_and_code
from .source import open_source
from .target_config import delta_config, output_dtype
from .weights import plan_routing_tensors, write_weights


def convert(
    src: str | Path,
    out: str | Path,
    *,
    mode: str = "delta_block",
    num_blocks: int | None = None,
    gate: bool | None = None,
    dtype: str | torch.dtype | None = None,
    overwrite: bool = False,
    revision: str | None = None,
    token: str | None = None,
    cache_dir: str | Path | None = None,
    model_id: str | None = None,
) -> Path:
    """Convert the Qwen3 checkpoint `src` (a local directory or a Hub id) into a DeltaQwen3 checkpoint at `out`.

    Args:
        src: A Qwen3 checkpoint directory or Hub model id (fetched with `revision`, `token`, `cache_dir`).
        out: The new checkpoint directory; it must not exist or be empty unless `overwrite`.
        mode, num_blocks: The routing mode and block count (SPEC section 3); `num_blocks=None` is 4, or the number
            of layers when the model has fewer.
        gate: Zero-initialised gates; `None` gates the delta modes, so the conversion is exact, and leaves the
            AttnRes modes (which have no gate) ungated. `False` is the paper's ungated initialisation.
        dtype: `"float32"`, `"float16"` or `"bfloat16"`; `None` keeps the source's.
        model_id: The Hub id the checkpoint will be published as, for its model card's usage snippet.

    Returns:
        The path of the written checkpoint. Tensors are streamed shard by shard; `src` is never written to, and
        `out` appears only once it is complete.

    Raises:
        CommandError: Bad input, before anything is written.
        RunError: The output could not be written (a full disk, no permission, an OUT that another process wrote
            meanwhile); nothing of it is left.
    """
    out = Path(out).expanduser().absolute()
    if Path(src).expanduser().is_dir():
        check_not_nested(Path(src).expanduser(), out)  # first: --overwrite cannot help there
    check_target(out, overwrite)  # before a possibly long download
    with output_lock("OUT", out):  # another conversion into OUT is refused until this one ends
        return _convert(src, out, mode=mode, num_blocks=num_blocks, gate=gate, dtype=dtype, overwrite=overwrite,
                        revision=revision, token=token, cache_dir=cache_dir, model_id=model_id)


def _convert(src: str | Path, out: Path, *, mode: str, num_blocks: int | None, gate: bool | None,
             dtype: str | torch.dtype | None, overwrite: bool, revision: str | None, token: str | None,
             cache_dir: str | Path | None, model_id: str | None) -> Path:  # fmt: skip
    source = open_source(src, revision=revision, token=token, cache_dir=cache_dir)
    if source.repo_id is not None:
        check_not_nested(source.path, out)  # where a download lies is known only now
    target_dtype = output_dtype(dtype, source.dtype)
    config = delta_config(source.config, mode, num_blocks, gate, target_dtype)
    additions = plan_routing_tensors(source, config, target_dtype)
    source_name = source.repo_id or source.path.name
    check_target(out, overwrite)  # again: OUT may have appeared during the download
    # Without --overwrite, an OUT that another process writes while this one converts is left to it.
    with (
        reporting_write_failure("OUT", out, "nothing of this conversion was kept"),
        staged_directory(out, replace=overwrite) as staging,
    ):
        write_weights(source, additions, staging, None if dtype is None else target_dtype)
        write_config_and_code(config, staging)
        copy_carried_files(source.path, staging)
        write_model_card(
            staging,
            config,
            model_id=model_id or out.name,
            description=conversion_description(source_name, config, source.dtype),
            base_model=source.repo_id,
            license=card_license(source.path),
        )
    return out
