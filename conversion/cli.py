"""`delta-qwen3 convert` and `delta-qwen3 push`."""

import argparse

from modeling_delta_qwen3 import DeltaQwen3Config
from modeling_delta_qwen3.routing_modes import ROUTING_MODES

from .converter import convert
from .hub import check_publishable, push_to_hub
from .source import open_source
from .target_config import OUTPUT_DTYPES, cast_caveat, is_function_preserving
from .verify import verify


def _hub_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--token", help="Hub access token (default: the logged-in token or HF_TOKEN)")
    parser.add_argument("--private", action="store_true", help="create the Hub repository as private")


def run_convert(args: argparse.Namespace) -> int:
    if args.push_to_hub:
        check_publishable(args.push_to_hub, "--push-to-hub", args.token)
    out = convert(
        args.src,
        args.out,
        mode=args.mode,
        num_blocks=args.num_blocks,
        gate=False if args.no_gate else None,
        dtype=args.dtype,
        overwrite=args.overwrite,
        revision=args.revision,
        token=args.token,
        cache_dir=args.cache_dir,
        model_id=args.push_to_hub,
    )
    config = DeltaQwen3Config.from_pretrained(out)
    print(f"Converted {args.src} to {out} (routing_mode={config.routing_mode}, "
          f"routing_num_blocks={config.routing_num_blocks}, routing_gate={config.routing_gate}, dtype={config.dtype})")
    caveat = ""
    if is_function_preserving(config):
        if args.dtype is not None:
            source = open_source(args.src, revision=args.revision, token=args.token, cache_dir=args.cache_dir)
            caveat = cast_caveat(source.dtype, config.dtype)
        print(f"The converted model computes exactly what the source computes{caveat}.")
    else:
        print("Note: the converted model no longer matches the source until it is fine-tuned.")
    if args.verify:
        difference = verify(args.src, out, revision=args.revision, token=args.token, cache_dir=args.cache_dir)
        cause = f" (the {args.dtype} rounding of the weights)" if caveat else ""
        print(f"Largest logit difference on the probe batch: {difference:.3e}{cause}")
    if args.push_to_hub:
        print(f"Published: {push_to_hub(out, args.push_to_hub, private=args.private, token=args.token)}")
    return 0


def run_push(args: argparse.Namespace) -> int:
    url = push_to_hub(args.dir, args.repo_id, private=args.private, token=args.token, base_model=args.base_model)
    print(f"Published: {url}")
    return 0


def register(subparsers) -> None:
    """Add the `convert` and `push` subcommands."""
    parser = subparsers.add_parser(
        "convert",
        help="convert a Qwen3 checkpoint (local directory or Hub id) to DeltaQwen3",
        description="Convert a Qwen3 checkpoint to DeltaQwen3. Gated delta modes compute exactly what the source did.",
    )
    parser.add_argument("src", metavar="SRC", help="Qwen3 checkpoint directory or Hub model id, e.g. Qwen/Qwen3-0.6B")
    parser.add_argument("out", metavar="OUT", help="new output directory")
    parser.add_argument("--mode", choices=ROUTING_MODES, default="delta_block",
                        help="routing mode (default: %(default)s)")
    parser.add_argument("--num-blocks", type=int,
                        help="blocks for the block modes (default: 4, or the number of layers if the model has fewer)")
    parser.add_argument("--no-gate", action="store_true",
                        help="no gates: the paper's ungated initialisation (changes the model's outputs)")
    parser.add_argument("--dtype", choices=OUTPUT_DTYPES, help="weight dtype (default: the source's)")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    parser.add_argument("--revision", help="Hub revision (branch, tag or commit) of SRC")
    parser.add_argument("--cache-dir", help="Hub cache directory (default: the Hugging Face cache)")
    parser.add_argument("--verify", action="store_true",
                        help="run source and converted model on a probe batch and print the largest logit difference")
    parser.add_argument("--push-to-hub", metavar="REPO_ID",
                        help="publish the converted checkpoint to this Hub repository")
    _hub_options(parser)
    parser.set_defaults(func=run_convert)

    parser = subparsers.add_parser("push", help="publish a DeltaQwen3 checkpoint directory to the Hub",
                                   description="Publish a DeltaQwen3 checkpoint directory (converted or fine-tuned).")
    parser.add_argument("dir", metavar="DIR", help="DeltaQwen3 checkpoint directory")
    parser.add_argument("repo_id", metavar="REPO_ID", help="Hub model repository, e.g. you/DeltaQwen3-0.6B")
    parser.add_argument("--base-model", help="base model named in the model card when DIR has no README.md")
    _hub_options(parser)
    parser.set_defaults(func=run_push)
