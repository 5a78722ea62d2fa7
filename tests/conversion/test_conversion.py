"""Conversion of a sharded Qwen3 checkpoint: exact function preservation, loaded the way a user loads it (fresh
interpreter, `trust_remote_code=True`, this project not importable), and the checkpoint format of SPEC section 4."""

import configparser
import json

import pytest
import torch
from helpers.files import tree_digest
from helpers.models import gate_shapes, save_tiny_qwen3, write_scalar_gates
from helpers.paths import MODEL_CODE_FILES, REPO_ROOT
from helpers.running import last_json_line, run_without_project
from safetensors import safe_open

from conversion import convert, verify
from conversion.model_card import ATTNRES_BIBTEX, DELTA_ATTNRES_BIBTEX, PROJECT_URL
from delta_qwen3.cli import main
from modeling_delta_qwen3.configuration_delta_qwen3 import AUTO_MAP
from modeling_delta_qwen3.routing_modes import GATEABLE_MODES



def read_weights(directory) -> dict[str, torch.Tensor]:
    tensors = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(file, framework="pt") as f:
            assert f.metadata() == {"format": "pt"}
            tensors |= {name: f.get_tensor(name) for name in f.keys()}
    return tensors


@pytest.fixture(scope="module")
def tied_checkpoint(tmp_path_factory, tokenizer):
    return save_tiny_qwen3(tmp_path_factory.mktemp("tied") / "tiny-qwen3-tied", tokenizer, seed=3,
                           tie_word_embeddings=True)


@pytest.fixture(scope="module")
def converted(tmp_path_factory, qwen3_checkpoint, tied_checkpoint) -> dict:
    """Each delta mode converted from the untied checkpoint, plus `delta_block` from the tied one; the source's
    files are recorded before and after."""
    root = tmp_path_factory.mktemp("converted")
    before = tree_digest(qwen3_checkpoint)
    dirs = {mode: convert(qwen3_checkpoint, root / mode, mode=mode, num_blocks=2) for mode in GATEABLE_MODES}
    dirs["tied"] = convert(tied_checkpoint, root / "tied", mode="delta_block", num_blocks=2)
    assert tree_digest(qwen3_checkpoint) == before, "the source was modified"
    return dirs


LOAD_AND_COMPARE = """
import json, torch
from transformers import AutoModelForCausalLM, Qwen3ForCausalLM
pairs = json.loads({pairs!r})
input_ids = torch.randint(3, 512, (2, 13), generator=torch.Generator().manual_seed(0))
result = {{}}
for name, (src, out) in pairs.items():
    source = AutoModelForCausalLM.from_pretrained(src).eval()
    target = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    assert isinstance(source, Qwen3ForCausalLM)
    with torch.no_grad():
        expected, actual = source(input_ids).logits, target(input_ids).logits
    result[name] = dict(
        diff=(actual - expected).abs().max().item(),
        scale=expected.abs().max().item(),
        cls=type(target).__module__ + "." + type(target).__name__,
        dtype=str(target.dtype),
        routing=[tuple(w.shape) for w in target(input_ids, output_routing_weights=True).routing_weights],
    )
print(json.dumps(result))
"""


@pytest.mark.slow
def test_converted_logits_equal_source_in_fresh_interpreter(converted, qwen3_checkpoint, tied_checkpoint, tmp_path):
    pairs = {mode: (str(qwen3_checkpoint), str(converted[mode])) for mode in GATEABLE_MODES}
    pairs["tied"] = (str(tied_checkpoint), str(converted["tied"]))
    result = last_json_line(run_without_project(LOAD_AND_COMPARE.format(pairs=json.dumps(pairs)), cwd=tmp_path).stdout)
    for name, values in result.items():
        assert values["diff"] <= 1e-5, name
        assert values["scale"] > 0.1, name  # the comparison is not between two near-zero tensors
        assert values["cls"].startswith("transformers_modules.") and values["cls"].endswith("DeltaQwen3ForCausalLM")
        assert values["dtype"] == "torch.float32"
    # 4 layers: 7 routing points; delta sees one more source per sublayer, delta_block (2 blocks) gains one at layer 2.
    assert [shape[-1] for shape in result["delta"]["routing"]] == [2, 3, 4, 5, 6, 7, 8]
    assert [shape[-1] for shape in result["delta_block"]["routing"]] == [1, 1, 1, 2, 2, 2, 2]


def test_checkpoint_format(converted, qwen3_checkpoint):
    out = converted["delta_block"]
    source_index = json.loads((qwen3_checkpoint / "model.safetensors.index.json").read_text())
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert shards == sorted(p.name for p in qwen3_checkpoint.glob("*.safetensors")) and len(shards) > 2
    assert not list(out.glob("*.bin")) and not list(out.glob("*.pt*"))
    # The index maps every tensor to the shard that holds it, and total_size is their size in bytes.
    tensors = read_weights(out)
    for shard in shards:
        with safe_open(out / shard, framework="pt") as f:
            assert {name for name, s in index["weight_map"].items() if s == shard} == set(f.keys())
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
    # Source tensors are unchanged and stay in their shard; routing tensors are new, with the SPEC's initial values.
    source = read_weights(qwen3_checkpoint)
    for name, tensor in source.items():
        assert torch.equal(tensors[name], tensor) and index["weight_map"][name] == source_index["weight_map"][name]
    routing = {name: tensor for name, tensor in tensors.items() if name not in source}
    expected_names = {f"model.layers.{i}.{point}.{p}" for i in range(4) for point in ("attn_route", "mlp_route")
                      for p in ("query", "norm.weight", "gate")} - {f"model.layers.0.attn_route.{p}"
                                                                     for p in ("query", "norm.weight", "gate")}
    assert set(routing) == expected_names
    for name, tensor in routing.items():
        assert tensor.dtype == torch.float32
        if name.endswith("gate"):
            assert tensor.shape == (1,) and tensor.item() == 0
        else:
            assert tensor.shape == (64,) and torch.all(tensor == (1 if name.endswith("norm.weight") else 0))
        # Next to its own layer's weights.
        layer_prefix = ".".join(name.split(".")[:3]) + "."
        layer_shards = {s for n, s in source_index["weight_map"].items() if n.startswith(layer_prefix)}
        assert index["weight_map"][name] in layer_shards


def test_config_code_and_carried_files(converted, qwen3_checkpoint):
    out = converted["delta_block"]
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "delta_qwen3" and config["architectures"] == ["DeltaQwen3ForCausalLM"]
    assert (config["routing_mode"], config["routing_num_blocks"], config["routing_gate"]) == ("delta_block", 2, True)
    assert config["dtype"] == "float32"
    assert config["auto_map"] == AUTO_MAP
    assert sorted(p.name for p in out.glob("*.py")) == MODEL_CODE_FILES
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / name).read_bytes() == (qwen3_checkpoint / name).read_bytes()
    source_config = json.loads((qwen3_checkpoint / "config.json").read_text())
    for key in ("hidden_size", "num_hidden_layers", "vocab_size", "rms_norm_eps", "tie_word_embeddings"):
        assert config[key] == source_config[key]


def test_model_card_links_the_project_and_cites_the_paper(converted):
    card = (converted["delta_block"] / "README.md").read_text()
    assert f"[DeltaQwen3]({PROJECT_URL})" in card
    assert f"## Citation\n\n```bibtex\n{DELTA_ATTNRES_BIBTEX}\n```" in card
    assert "2603.15031" not in card  # the AttnRes paper is cited by the AttnRes modes' cards only


def test_package_metadata_names_the_project_url_the_card_links():
    setup = configparser.ConfigParser()
    setup.read(REPO_ROOT / "setup.cfg")
    assert setup["metadata"]["url"] == PROJECT_URL


def test_tied_embeddings_keep_no_head(converted):
    tensors = read_weights(converted["tied"])
    assert "lm_head.weight" not in tensors and "model.embed_tokens.weight" in tensors
    assert json.loads((converted["tied"] / "config.json").read_text())["tie_word_embeddings"] is True


def test_single_file_checkpoint_stays_single_file(tmp_path, tokenizer):
    src = save_tiny_qwen3(tmp_path / "src", tokenizer, max_shard_size="50MB")
    out = convert(src, tmp_path / "out", mode="delta")
    assert sorted(p.name for p in out.glob("*.safetensors*")) == ["model.safetensors"]
    assert verify(src, out) == 0.0


def test_verify_loads_a_conversion_with_0d_gates(qwen3_checkpoint, tmp_path):
    """A conversion written before the gates became `[1]` (SPEC section 4) still verifies as exact."""
    out = convert(qwen3_checkpoint, tmp_path / "out", mode="delta_block", num_blocks=2)
    write_scalar_gates(out)
    assert gate_shapes(out) == {()}
    assert verify(qwen3_checkpoint, out) == 0.0


def test_dtype_option_casts_everything(qwen3_checkpoint, tmp_path):
    out = convert(qwen3_checkpoint, tmp_path / "bf16", mode="delta", dtype="bfloat16")
    tensors = read_weights(out)
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    source = read_weights(qwen3_checkpoint)
    assert torch.equal(tensors["model.norm.weight"], source["model.norm.weight"].to(torch.bfloat16))


@pytest.mark.parametrize(
    "args, gate",
    [(["--mode", "attnres_full"], False), (["--mode", "attnres_block", "--num-blocks", "2"], False),
     (["--mode", "delta", "--no-gate"], False)],
)
def test_non_preserving_conversions_say_so(qwen3_checkpoint, tmp_path, capsys, args, gate):
    out = tmp_path / "out"
    assert main(["convert", str(qwen3_checkpoint), str(out), *args, "--verify"]) == 0
    printed = capsys.readouterr().out
    assert "no longer matches the source until it is fine-tuned" in printed
    difference = float(printed.split("Largest logit difference on the probe batch: ")[1].split()[0])
    assert difference > 1e-5  # well above float32 noise; exact conversions give 0
    assert json.loads((out / "config.json").read_text())["routing_gate"] is gate
    card = (out / "README.md").read_text()
    assert "does **not** reproduce" in card
    assert (f"```bibtex\n{DELTA_ATTNRES_BIBTEX}\n\n{ATTNRES_BIBTEX}\n```" in card) is args[1].startswith("attnres")


def test_cli_verify_reports_exact_conversion(qwen3_checkpoint, tmp_path, capsys):
    assert main(["convert", str(qwen3_checkpoint), str(tmp_path / "out"), "--num-blocks", "2", "--verify"]) == 0
    printed = capsys.readouterr().out
    assert "computes exactly what the source computes" in printed
    assert "Largest logit difference on the probe batch: 0.000e+00" in printed
