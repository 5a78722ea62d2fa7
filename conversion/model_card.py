"""The model card (`README.md` with Hub metadata) of a DeltaQwen3 checkpoint."""

from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData, metadata_load

from modeling_delta_qwen3 import DeltaQwen3Config
from modeling_delta_qwen3.routing_modes import ROUTING_MODES

from .target_config import cast_caveat, is_function_preserving

PAPER = "[Delta Attention Residuals](https://arxiv.org/abs/2605.18855)"
# Where the project lives; also `url` in setup.cfg (a test keeps the two equal).
PROJECT_URL = "https://github.com/DeltaQwen3/DeltaQwen3"
DELTA_ATTNRES_BIBTEX = """@misc{luo2026deltaattnres,
  title         = {Delta Attention Residuals},
  author        = {Luo and Cai and Hu},
  year          = {2026},
  eprint        = {2605.18855},
  archivePrefix = {arXiv},
  url           = {https://arxiv.org/abs/2605.18855}
}"""
ATTNRES_BIBTEX = """@misc{kimiteam2026attnres,
  title         = {Attention Residuals},
  author        = {{Kimi Team}},
  year          = {2026},
  eprint        = {2603.15031},
  archivePrefix = {arXiv},
  url           = {https://arxiv.org/abs/2603.15031}
}"""
TAGS = ["delta-qwen3", "delta-attention-residuals", "qwen3", "custom_code"]
LICENSE_KEYS = ("license", "license_name", "license_link")


def card_license(directory: Path) -> dict:
    """The license fields of the model card in `directory` (empty when it has none or they cannot be read), so a
    converted checkpoint keeps its source's license."""
    try:
        metadata = metadata_load(directory / "README.md")
    except (OSError, ValueError):
        return {}
    if not isinstance(metadata, dict):  # no metadata, or YAML that is not a mapping
        return {}
    return {key: metadata[key] for key in LICENSE_KEYS if metadata.get(key)}


def conversion_description(source_name: str, config: DeltaQwen3Config, source_dtype: str) -> str:
    """What a freshly converted checkpoint is, and whether it still computes what its source (whose weights were
    stored in `source_dtype`) computed."""
    link = f"[{source_name}](https://huggingface.co/{source_name})" if "/" in source_name else f"`{source_name}`"
    if is_function_preserving(config):
        status = (
            "Freshly converted, its routing queries are zero, its routing norms one and its gates zero, so it computes "
            f"exactly what the source computes{cast_caveat(source_dtype, config.dtype)}; fine-tuning lets the routing "
            "learn."
        )
    else:
        status = (
            "This routing setting changes the function: the checkpoint does **not** reproduce the source's outputs "
            "until it is fine-tuned."
        )
    return f"{link} converted to DeltaQwen3 with `delta-qwen3 convert`. {status}"


def citation(config: DeltaQwen3Config) -> str:
    """The BibTeX of the paper behind the checkpoint's routing mode: the AttnRes comparison modes also cite the
    paper that introduced them."""
    entries = [DELTA_ATTNRES_BIBTEX]
    if not ROUTING_MODES[config.routing_mode].residual_stream:  # the modes that replace it are AttnRes's
        entries.append(ATTNRES_BIBTEX)
    return "\n\n".join(entries)


def _routing_table(config: DeltaQwen3Config) -> str:
    rows = [("routing_mode", f"`{config.routing_mode}`"), ("routing_gate", f"`{config.routing_gate}`")]
    if ROUTING_MODES[config.routing_mode].blocks:
        blocks = f"`{config.routing_num_blocks}` ({config.layers_per_block} layers per block)"
        rows.append(("routing_num_blocks", blocks))
    rows.append(("num_hidden_layers", f"`{config.num_hidden_layers}`"))
    return "\n".join(["| setting | value |", "|---|---|", *(f"| {key} | {value} |" for key, value in rows)])


def _vllm_serving(config: DeltaQwen3Config, model_id: str) -> str:
    """How to serve the checkpoint with vLLM; on the CPU under PyTorch before 2.14, a `delta_block` checkpoint refuses
    vLLM's compiled mode, which that Inductor gets wrong there (docs/SERVING.md), and is served in eager mode."""
    mode = ROUTING_MODES[config.routing_mode]
    cpu = (
        "\n\nOn the CPU with PyTorch before 2.14 (vLLM's CPU builds up to 0.32 pin 2.13) add `--enforce-eager`: in "
        "`delta_block` mode the model refuses vLLM's compiled mode there, which that PyTorch's Inductor gets wrong."
        if mode.miscompiled_on_cpu_before_torch_2_14 else ""
    )
    return f"""vLLM serves it through its Transformers modeling backend, with continuous batching and the OpenAI-compatible
server; pipeline parallelism is not supported:

```bash
vllm serve {model_id} --trust-remote-code
```{cpu}"""


# What the Hub calls the task of each head, and how a head checkpoint is loaded (the causal LM's usage is below).
PIPELINE_TAGS = {
    "DeltaQwen3ForCausalLM": "text-generation",
    "DeltaQwen3ForSequenceClassification": "text-classification",
    "DeltaQwen3ForTokenClassification": "token-classification",
    "DeltaQwen3ForQuestionAnswering": "question-answering",
}


def _architecture(config: DeltaQwen3Config) -> str:
    """The class the checkpoint was saved from: a causal LM unless its config names another."""
    return (config.architectures or ["DeltaQwen3ForCausalLM"])[0]


def _usage(config: DeltaQwen3Config, model_id: str) -> str:
    """Loading and running the checkpoint; a causal LM also generates, reports its routing and is served by vLLM."""
    architecture = _architecture(config)
    if architecture != "DeltaQwen3ForCausalLM":
        auto_class = architecture.replace("DeltaQwen3", "AutoModel")
        return f"""```python
from transformers import {auto_class}, AutoTokenizer

model = {auto_class}.from_pretrained("{model_id}", trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained("{model_id}", trust_remote_code=True)
outputs = model(**tokenizer("Depth routing", return_tensors="pt"))
```"""
    return f"""```python
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("{model_id}", trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained("{model_id}", trust_remote_code=True)
inputs = tokenizer("Depth routing", return_tensors="pt")
print(tokenizer.decode(model.generate(**inputs, max_new_tokens=20)[0]))
routing_weights = model(**inputs, output_routing_weights=True).routing_weights
```

{_vllm_serving(config, model_id)}"""


def build_model_card(config: DeltaQwen3Config, model_id: str, description: str, base_model: str | None = None,
                     license: dict | None = None) -> ModelCard:
    """A card for the checkpoint published (or saved) as `model_id`: Hub metadata, what it is, its routing
    settings, how to load it, where the project lives and how to cite the paper."""
    data = ModelCardData(
        base_model=base_model,
        library_name="transformers",
        pipeline_tag=PIPELINE_TAGS[_architecture(config)],
        tags=list(TAGS),
        **(license or {}),
    )
    body = f"""
# {model_id.rsplit("/", 1)[-1]}

Qwen3 with {PAPER} (Luo, Cai, Hu, 2026): each attention and MLP sublayer adds a learned, per-token softmax mixture
of what earlier sublayers (or blocks of layers) added to the residual stream. Made with
[DeltaQwen3]({PROJECT_URL}), the Transformers extension that converts, fine-tunes and evaluates such models.

{description}

## Routing

{_routing_table(config)}

## Usage

The model code ships with the checkpoint, so only Transformers is needed:

{_usage(config, model_id)}

## Citation

```bibtex
{citation(config)}
```
"""
    return ModelCard(f"---\n{data.to_yaml()}\n---\n{body}")


def write_model_card(directory: Path, config: DeltaQwen3Config, model_id: str, description: str,
                     base_model: str | None = None, license: dict | None = None) -> Path:
    """Write `build_model_card(...)` as `directory/README.md` and return its path."""
    path = Path(directory) / "README.md"
    build_model_card(config, model_id, description, base_model, license).save(path)
    return path
