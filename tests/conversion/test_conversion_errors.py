"""Bad input to `delta-qwen3 convert`: a message that names the problem, exit code 2, nothing written, the source
untouched, and no half-written output after an interruption."""

import errno
import json
import os
import shutil
import subprocess
import sys

import pytest
from helpers.files import disk_full_past, tree_digest
from helpers.paths import REPO_ROOT
from helpers.running import isolated_env

from conversion import converter
from delta_qwen3.cli import main


@pytest.fixture
def src(tmp_path, qwen3_checkpoint):
    """A private copy of the tiny sharded checkpoint, free to be damaged."""
    return shutil.copytree(qwen3_checkpoint, tmp_path / "src")


def edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | changes))


def convert_fails(capsys, src, out, *options) -> str:
    """Run `delta-qwen3 convert` in process, check it fails with exit code 2 leaving nothing behind, return the
    message."""
    before = tree_digest(src) if src.is_dir() else None
    siblings = set(out.parent.iterdir()) if out.parent.exists() else set()
    assert main(["convert", str(src), str(out), *options]) == 2
    if before is not None:
        assert tree_digest(src) == before
    assert set(out.parent.iterdir()) == siblings if out.parent.exists() else True
    err = capsys.readouterr().err
    assert err.startswith("delta-qwen3 convert: error: ")
    return err


def test_missing_source_in_console_command(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "delta_qwen3.cli", "convert", str(tmp_path / "no-such-model"), str(tmp_path / "out")],
        cwd=REPO_ROOT, env=isolated_env(), capture_output=True, text=True,
    )
    assert result.returncode == 2
    assert f"delta-qwen3 convert: error: SRC {tmp_path / 'no-such-model'} does not exist" in result.stderr
    assert not (tmp_path / "out").exists()


def test_not_a_checkpoint(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert "it has no config.json" in convert_fails(capsys, tmp_path / "empty", tmp_path / "out")
    (tmp_path / "file").write_text("x")
    assert "is a file, not a checkpoint directory" in convert_fails(capsys, tmp_path / "file", tmp_path / "out")


def test_pickled_weights_are_named(src, tmp_path, capsys):
    for shard in src.glob("*.safetensors*"):
        shard.unlink()
    (src / "pytorch_model.bin").write_bytes(b"")
    assert "found pytorch_model.bin; only safetensors weights are read" in convert_fails(capsys, src, tmp_path / "o")


@pytest.mark.parametrize(
    "model_type, message",
    [
        ("llama", "has model_type 'llama'; only Qwen3 (model_type 'qwen3') can be converted"),
        ("qwen3_moe", "is a Qwen3-MoE checkpoint (model_type 'qwen3_moe'): mixture-of-experts is a different"),
        ("delta_qwen3", "is already a DeltaQwen3 checkpoint"),
    ],
)
def test_wrong_model_type(src, tmp_path, capsys, model_type, message):
    edit_config(src, model_type=model_type)
    assert message in convert_fails(capsys, src, tmp_path / "out")


def test_tensors_not_matching_config(src, tmp_path, capsys):
    config = json.loads((src / "config.json").read_text())
    edit_config(src, num_hidden_layers=5, layer_types=config["layer_types"] + ["full_attention"])
    err = convert_fails(capsys, src, tmp_path / "out")
    assert "does not match its own Qwen3 config; tensors missing: model.layers.4." in err
    edit_config(src, num_hidden_layers=4, layer_types=config["layer_types"], intermediate_size=96)
    err = convert_fails(capsys, src, tmp_path / "out")
    assert "tensors wrong shape: model.layers.0.mlp.down_proj.weight" in err


def test_output_not_empty(src, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert "exists and is not empty (pass --overwrite to replace it)" in convert_fails(capsys, src, out)
    assert (out / "keep.txt").read_text() == "mine"
    assert main(["convert", str(src), str(out), "--num-blocks", "2", "--overwrite"]) == 0
    assert not (out / "keep.txt").exists() and (out / "config.json").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_output_inside_source_or_source_inside_output(src, tmp_path, capsys):
    assert "is inside SRC" in convert_fails(capsys, src, src / "converted")
    assert "is inside SRC" in convert_fails(capsys, src, src, "--overwrite")
    assert "replacing OUT would delete it" in convert_fails(capsys, src, tmp_path, "--overwrite")


@pytest.mark.parametrize("blocks", ["0", "5"])
def test_block_count_out_of_range(src, tmp_path, capsys, blocks):
    err = convert_fails(capsys, src, tmp_path / "out", "--num-blocks", blocks)
    assert f"routing_num_blocks={blocks} is out of range: it must be between 1 and num_hidden_layers=4" in err


def test_truncated_and_corrupt_shards(src, tmp_path, capsys):
    shard = src / "model-00003-of-00009.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[:-10])
    err = convert_fails(capsys, src, tmp_path / "out")
    assert f"{shard} is not a readable safetensors file (corrupt or truncated?)" in err
    shard.write_bytes(b"\x00" * 64)
    assert f"{shard} is not a readable safetensors file" in convert_fails(capsys, src, tmp_path / "out")
    shard.unlink()
    assert "names missing shard(s) model-00003-of-00009.safetensors" in convert_fails(capsys, src, tmp_path / "out")


def test_broken_tokenizer_files_are_named(src, tmp_path, capsys, qwen3_checkpoint):
    # Carried into the output unchanged, they would fail only when the converted checkpoint is first loaded.
    config = src / "tokenizer_config.json"
    config.write_text(config.read_text()[:-5])
    assert f"the tokenizer file {config} is not valid JSON" in convert_fails(capsys, src, tmp_path / "out")
    shutil.copyfile(qwen3_checkpoint / "tokenizer_config.json", config)
    (src / "tokenizer.json").write_text("{}")
    err = convert_fails(capsys, src, tmp_path / "out")
    assert f"the tokenizer file {src / 'tokenizer.json'} cannot be read as a tokenizer" in err


@pytest.mark.parametrize("existing", [False, True])
def test_interrupted_conversion_leaves_no_output(src, tmp_path, monkeypatch, existing):
    """An interrupt after the weights are written leaves OUT as it was (absent, or the previous contents)."""
    out = tmp_path / "out"
    if existing:
        out.mkdir()
        (out / "previous.txt").write_text("previous")

    def interrupted(*args, **kwargs):
        assert any(p.name.startswith(".out.partial-") for p in tmp_path.iterdir())  # weights are in the staging dir
        raise KeyboardInterrupt

    monkeypatch.setattr(converter, "write_model_card", interrupted)
    before = tree_digest(src)
    with pytest.raises(KeyboardInterrupt):
        converter.convert(src, out, num_blocks=2, overwrite=existing)
    assert sorted(p.name for p in tmp_path.iterdir()) == (["out", "src"] if existing else ["src"])
    if existing:
        assert [p.name for p in out.iterdir()] == ["previous.txt"]
    assert tree_digest(src) == before


def test_architecture_without_a_deltaqwen3_class(capsys, src, tmp_path):
    edit_config(src, architectures=["Qwen3Model"])
    err = convert_fails(capsys, src, tmp_path / "out")
    assert "cannot convert architectures ['Qwen3Model']: a Qwen3 checkpoint of one of Qwen3ForCausalLM, " in err


@pytest.mark.parametrize(
    "file, edit, message",
    [
        ("config.json", {"quantization_config": "gptq"}, "is quantised (unknown); convert the unquantised checkpoint"),
        ("config.json", {"num_hidden_layers": "4"}, "cannot convert to DeltaQwen3: the source's config.json: "
         "num_hidden_layers must be a positive whole number, got '4'"),
        ("config.json", {"num_hidden_layers": None}, "cannot convert to DeltaQwen3: the source's config.json: "
         "num_hidden_layers must be a positive whole number, got None"),
        ("config.json", {"tie_word_embeddings": "no"}, "cannot convert to DeltaQwen3: Validation error for field "
         "'tie_word_embeddings': TypeError: Field 'tie_word_embeddings' expected bool, got str (value: 'no')"),
        ("config.json", {"architectures": {"0": "Qwen3ForCausalLM"}}, "cannot convert architectures "
         "{'0': 'Qwen3ForCausalLM'}: config.json must name them in a list"),
        ("model.safetensors.index.json", {"weight_map": None}, "model.safetensors.index.json is not a valid index (its "
         "weight_map is not an object of tensor names to file names)"),
        ("model.safetensors.index.json", {"weight_map": ["model.embed_tokens.weight"]}, "model.safetensors.index.json "
         "is not a valid index (its weight_map is not an object of tensor names to file names)"),
        ("model.safetensors.index.json", {"weight_map": {"model.embed_tokens.weight": 1}}, "model.safetensors.index."
         "json is not a valid index (its weight_map is not an object of tensor names to file names)"),
    ],
)  # fmt: skip
def test_hand_edited_sources_that_still_load_as_json_are_one_line(src, tmp_path, capsys, file, edit, message):
    fields = json.loads((src / file).read_text())
    (src / file).write_text(json.dumps(fields | edit))
    err = convert_fails(capsys, src, tmp_path / "out")
    assert len(err.splitlines()) == 1 and err.endswith(f"{message}\n")


def test_null_where_an_object_may_stand_is_its_absence(src, tmp_path, capsys):
    edit_config(src, quantization_config=None)
    (src / "README.md").write_text("---\n- a list, not a mapping\n---\n# Tiny\n")
    assert main(["convert", str(src), str(tmp_path / "out"), "--num-blocks", "2"]) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text()).get("quantization_config") is None
    assert "license:" not in (tmp_path / "out" / "README.md").read_text()


# --- the output meets the disk -----------------------------------------------------------------------------------


def write_fails(capsys, src, out, *options) -> str:
    """Run `delta-qwen3 convert`, expect exit code 1, nothing of it left beside OUT and one line on stderr: that
    line."""
    assert main(["convert", str(src), str(out), "--num-blocks", "2", *options]) == 1
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".")] == []
    lines = capsys.readouterr().err.strip().splitlines()
    assert len([line for line in lines if "convert" in line]) == 1
    return lines[-1]


def test_a_full_disk_is_one_line_and_leaves_nothing(src, tmp_path, capsys):
    with disk_full_past(50_000):  # less than a shard
        line = write_fails(capsys, src, tmp_path / "out")
    assert line == (f"delta-qwen3 convert: error: could not write OUT {tmp_path / 'out'}: Error while serializing: "
                    "I/O error: File too large (os error 27) (nothing of this conversion was kept)")  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_a_parent_without_write_permission_is_one_line(src, tmp_path, capsys, monkeypatch):
    (tmp_path / "read-only").mkdir()
    mkdir = os.mkdir

    def refused(path, *args, **kwargs):  # what a read-only directory does to a process that is not root
        if os.path.dirname(path) == str(tmp_path / "read-only"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", refused)
    out = tmp_path / "read-only" / "out"
    assert write_fails(capsys, src, out) == (
        f"delta-qwen3 convert: error: could not write OUT {out}: Permission denied (nothing of this conversion was kept)"
    )
    assert list((tmp_path / "read-only").iterdir()) == []


def test_an_output_written_by_another_process_meanwhile_is_left_to_it(src, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    write_model_card = converter.write_model_card

    def meanwhile(*args, **kwargs):
        out.mkdir()
        (out / "theirs.txt").write_text("theirs")
        return write_model_card(*args, **kwargs)

    monkeypatch.setattr(converter, "write_model_card", meanwhile)
    assert write_fails(capsys, src, out) == (
        f"delta-qwen3 convert: error: could not write OUT {out}: it was written by another process meanwhile, and "
        "is left as it is (nothing of this conversion was kept)"
    )
    assert [p.name for p in out.iterdir()] == ["theirs.txt"]


@pytest.mark.parametrize("overwrite", [False, True])
def test_an_output_that_is_a_symbolic_link_is_written_where_it_points(src, tmp_path, capsys, overwrite):
    (tmp_path / "real").mkdir()
    if overwrite:
        (tmp_path / "real" / "earlier.txt").write_text("earlier")
    (tmp_path / "link").symlink_to("real")
    options = ["--num-blocks", "2", *(["--overwrite"] if overwrite else [])]
    assert main(["convert", str(src), str(tmp_path / "link"), *options]) == 0
    assert os.readlink(tmp_path / "link") == "real"
    assert (tmp_path / "real" / "config.json").is_file() and not (tmp_path / "real" / "earlier.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real", "src"]
