"""The Hub boundary: a Hub id as SRC (only `snapshot_download` is replaced) and publishing (only the repository
creation and commit calls are replaced, by writing the commit into a local folder that is then loaded like a Hub
repository)."""

import shutil
from types import SimpleNamespace

import huggingface_hub
import pytest
from helpers.files import tree_digest
from helpers.running import last_json_line, run_without_project
from huggingface_hub import HfApi, ModelCard
from huggingface_hub.errors import LocalEntryNotFoundError

from conversion import convert, push_to_hub
from conversion.model_card import ATTNRES_BIBTEX, DELTA_ATTNRES_BIBTEX, PROJECT_URL, build_model_card
from delta_qwen3.cli import main
from delta_qwen3.errors import CommandError
from finetune.outputs import push_to_hub as finetune_push
from modeling_delta_qwen3 import DeltaQwen3Config

LICENSED_CARD = "---\nlicense: apache-2.0\nlanguage: en\n---\n# Tiny Qwen3\n"


@pytest.fixture
def hub_source(tmp_path, qwen3_checkpoint, monkeypatch):
    """`snapshot_download` serves a copy of the tiny checkpoint (with a licensed model card) as any Hub id, and
    records how it was called."""
    snapshot = shutil.copytree(qwen3_checkpoint, tmp_path / "snapshot")
    (snapshot / "README.md").write_text(LICENSED_CARD)
    calls = []

    def snapshot_download(repo_id, **kwargs):
        calls.append(dict(repo_id=repo_id, **kwargs))
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return SimpleNamespace(path=snapshot, calls=calls)


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    """Repository creation and commits write into `tmp_path/hub/<repo_id>` instead of the Hub, for a user with a
    token."""
    root = tmp_path / "hub"
    calls = []
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")

    def create_repo(self, repo_id, **kwargs):
        calls.append(("create_repo", repo_id, kwargs))
        return f"https://huggingface.co/{repo_id}"

    def create_commit(self, repo_id, operations, **kwargs):
        calls.append(("create_commit", repo_id, kwargs))
        for operation in operations:
            (root / repo_id / operation.path_in_repo).parent.mkdir(parents=True, exist_ok=True)
            with operation.as_file() as content:
                (root / repo_id / operation.path_in_repo).write_bytes(content.read())
        return SimpleNamespace(commit_url=f"https://huggingface.co/{repo_id}/commit/0000")

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "create_commit", create_commit)
    return SimpleNamespace(root=root, calls=calls)


LOAD_PUBLISHED = """
import json, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
source = AutoModelForCausalLM.from_pretrained({source!r}).eval()
published = AutoModelForCausalLM.from_pretrained({published!r}, trust_remote_code=True).eval()
tokenizer = AutoTokenizer.from_pretrained({published!r}, trust_remote_code=True)
input_ids = tokenizer(["def routing(x):", "Depth is all you need"], return_tensors="pt", padding=True).input_ids
with torch.no_grad():
    diff = (published(input_ids).logits - source(input_ids).logits).abs().max().item()
print(json.dumps(dict(diff=diff, cls=type(published).__name__, tokens=input_ids.shape[1])))
"""


@pytest.mark.slow
def test_hub_id_converted_and_published(hub_source, fake_hub, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["convert", "Qwen/Qwen3-Tiny", str(out), "--num-blocks", "2", "--revision", "v1.0", "--token", "hf_x",
                 "--cache-dir", str(tmp_path / "cache"), "--push-to-hub", "me/DeltaQwen3-Tiny", "--private"]) == 0
    assert "Published: https://huggingface.co/me/DeltaQwen3-Tiny/commit/0000" in capsys.readouterr().out

    # The Hub options reach the download; only what the conversion reads is fetched.
    [call] = hub_source.calls
    assert (call["repo_id"], call["revision"], call["token"], call["cache_dir"]) == (
        "Qwen/Qwen3-Tiny", "v1.0", "hf_x", str(tmp_path / "cache"))
    assert {"config.json", "*.safetensors", "tokenizer.json", "README.md"} <= set(call["allow_patterns"])
    assert "*.bin" not in call["allow_patterns"]
    assert [(name, repo, kwargs.get("private")) for name, repo, kwargs in fake_hub.calls] == [
        ("create_repo", "me/DeltaQwen3-Tiny", True), ("create_commit", "me/DeltaQwen3-Tiny", None)]

    published = fake_hub.root / "me/DeltaQwen3-Tiny"
    assert sorted(p.name for p in published.iterdir()) == sorted(p.name for p in out.iterdir())
    card = ModelCard.load(published / "README.md")
    assert card.data.base_model == "Qwen/Qwen3-Tiny"
    assert card.data.license == "apache-2.0"
    assert card.data.library_name == "transformers" and "delta-qwen3" in card.data.tags
    assert 'from_pretrained("me/DeltaQwen3-Tiny", trust_remote_code=True)' in card.text
    assert "vllm serve me/DeltaQwen3-Tiny --trust-remote-code" in card.text
    assert "| routing_mode | `delta_block` |" in card.text and "computes exactly what the source computes" in card.text

    result = last_json_line(run_without_project(
        LOAD_PUBLISHED.format(source=str(hub_source.path), published=str(published)), cwd=tmp_path).stdout)
    assert result["cls"] == "DeltaQwen3ForCausalLM" and result["tokens"] > 3
    assert result["diff"] <= 1e-5


def test_push_writes_a_card_only_when_missing(qwen3_checkpoint, fake_hub, tmp_path, capsys):
    finetuned = convert(qwen3_checkpoint, tmp_path / "finetuned", mode="attnres_block", num_blocks=2)
    (finetuned / "README.md").unlink()
    assert main(["push", str(finetuned), "me/tuned", "--base-model", "me/DeltaQwen3-Tiny"]) == 0
    assert "Published: https://huggingface.co/me/tuned/commit/0000" in capsys.readouterr().out
    assert fake_hub.calls[0] == ("create_repo", "me/tuned", dict(private=False, exist_ok=True, repo_type="model"))
    card = ModelCard.load(fake_hub.root / "me/tuned/README.md")
    assert card.data.base_model == "me/DeltaQwen3-Tiny" and card.data.license is None
    assert "| routing_num_blocks | `2` (2 layers per block) |" in card.text
    assert "vllm serve me/tuned --trust-remote-code" in card.text
    assert f"[DeltaQwen3]({PROJECT_URL})" in card.text
    assert DELTA_ATTNRES_BIBTEX in card.text and ATTNRES_BIBTEX in card.text  # an AttnRes mode cites both papers
    assert not (finetuned / "README.md").exists()  # the card is uploaded, never written into DIR

    (finetuned / "README.md").write_text("---\nlicense: mit\n---\n# My own card\n")
    assert push_to_hub(finetuned, "me/tuned2") == "https://huggingface.co/me/tuned2/commit/0000"
    assert (fake_hub.root / "me/tuned2/README.md").read_text() == "---\nlicense: mit\n---\n# My own card\n"


def test_push_refuses_what_would_not_load(qwen3_checkpoint, fake_hub, tmp_path, capsys):
    assert main(["push", str(qwen3_checkpoint), "me/x"]) == 2
    assert "has model_type 'qwen3', not 'delta_qwen3' (convert it first" in capsys.readouterr().err
    converted = convert(qwen3_checkpoint, tmp_path / "c", num_blocks=2)
    (converted / "routing.py").unlink()
    assert main(["push", str(converted), "me/x"]) == 2
    assert "lacks the model code for trust_remote_code (routing.py)" in capsys.readouterr().err
    assert fake_hub.calls == []


@pytest.mark.parametrize(
    "config, message",
    [
        (b'{"model_type": "delta_qwen3",', "JSONDecodeError: Expecting property name enclosed in double quotes: line 1 "
         "column 30 (char 29)"),
        (b'["delta_qwen3"]', None),
        (b'{"model_type": "delta_qwen3", "hidden_size": "64"}', "StrictDataclassFieldValidationError: Validation error "
         "for field 'hidden_size': TypeError: Field 'hidden_size' expected int, got str (value: '64')"),
    ],
)  # fmt: skip
def test_push_names_a_hand_edited_config_in_one_line(qwen3_checkpoint, fake_hub, tmp_path, capsys, config, message):
    converted = convert(qwen3_checkpoint, tmp_path / "c", num_blocks=2)
    (converted / "config.json").write_bytes(config)
    capsys.readouterr()
    assert main(["push", str(converted), "me/x"]) == 2
    expected = (f"could not load DIR {converted}: {message}" if message else
                f"DIR {converted} has model_type None, not 'delta_qwen3'")  # fmt: skip
    assert capsys.readouterr().err == f"delta-qwen3 push: error: {expected}\n"
    assert fake_hub.calls == []


def test_hub_errors_are_command_errors(monkeypatch, tmp_path, capsys):
    def snapshot_download(repo_id, **kwargs):
        raise LocalEntryNotFoundError(f"Cannot find {repo_id} in the local cache and outgoing traffic is disabled")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    assert main(["convert", "Qwen/No-Such-Model", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "SRC Qwen/No-Such-Model is not a local directory and could not be fetched from the Hub" in err
    assert "outgoing traffic is disabled" in err and not (tmp_path / "out").exists()


def test_push_never_writes_into_dir_even_when_the_upload_fails(qwen3_checkpoint, fake_hub, tmp_path, monkeypatch,
                                                               capsys):
    converted = convert(qwen3_checkpoint, tmp_path / "c", num_blocks=2)
    (converted / "README.md").unlink()
    before = tree_digest(converted)

    def unreachable(self, repo_id, operations, **kwargs):
        raise ConnectionError("Hub unreachable")

    with monkeypatch.context() as offline:
        offline.setattr(HfApi, "create_commit", unreachable)
        assert main(["push", str(converted), "me/x"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err == f"delta-qwen3 push: error: could not publish {converted} to me/x: Hub unreachable"
    assert tree_digest(converted) == before

    assert main(["push", str(converted), "me/x"]) == 0
    assert ModelCard.load(fake_hub.root / "me/x/README.md").data.library_name == "transformers"
    assert tree_digest(converted) == before


def test_finetune_publishes_through_the_checked_upload_with_a_card(qwen3_checkpoint, fake_hub, tmp_path):
    """`finetune --push-to-hub` and `delta-qwen3 push` are the same upload: the model card is published (not
    written into the run's model directory) and a directory that would not load is refused."""
    model = convert(qwen3_checkpoint, tmp_path / "run" / "model", num_blocks=2)
    (model / "README.md").unlink()
    before = tree_digest(model)
    assert finetune_push(model, "me/tuned") == "https://huggingface.co/me/tuned/commit/0000"
    assert "| routing_mode | `delta_block` |" in (fake_hub.root / "me/tuned/README.md").read_text()
    assert tree_digest(model) == before
    (model / "routing.py").unlink()
    with pytest.raises(CommandError, match=r"lacks the model code for trust_remote_code \(routing.py\)"):
        finetune_push(model, "me/tuned2")
    assert not (fake_hub.root / "me/tuned2").exists()


@pytest.mark.parametrize(("mode", "blocks", "eager_on_cpu"), [
    ("delta_block", 2, True), ("delta_block", 4, True), ("attnres_block", 2, False), ("delta", 1, False),
])
def test_card_serves_with_vllm_and_says_when_the_cpu_needs_eager_mode(mode, blocks, eager_on_cpu):
    """vLLM's compiled mode on the CPU is refused in delta_block mode (tests/serving/test_vllm.py)."""
    config = DeltaQwen3Config(num_hidden_layers=4, routing_mode=mode, routing_num_blocks=blocks)
    text = build_model_card(config, "me/x", "A test.").text
    assert "```bash\nvllm serve me/x --trust-remote-code\n```" in text
    assert ("On the CPU with PyTorch before 2.14" in text) == eager_on_cpu
