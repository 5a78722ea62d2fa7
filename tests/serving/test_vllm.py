"""vLLM serves DeltaQwen3 checkpoints through its Transformers modeling backend, loading the model code as remote
code, and computes what `generate` computes. vLLM runs in its own environment (`make test` creates `.venv-vllm`,
which has vLLM's CPU build and not this project); checkpoints and expected tokens are made here."""

import concurrent.futures
import copy
import json
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from helpers.models import gate_shapes, save_random_delta, save_tiny_qwen3, write_scalar_gates
from helpers.environments import require_environment
from helpers.paths import REPO_ROOT, VLLM_PATH, VLLM_PYTHON
from helpers.running import isolated_env, run_without_project
from transformers import Qwen3ForCausalLM

from modeling_delta_qwen3.routing_modes import ROUTING_MODES

RUNNER = REPO_ROOT / "benchmarks" / "vllm_runner.py"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def vllm_environment():
    """Before the module's other fixtures: the tests need .venv-vllm (`require_environment`)."""
    require_environment(VLLM_PATH)


# vLLM's CPU attention refuses the fixtures' head size of 16. Two layers of one block each: every routing mechanism
# of a mode is there, and compiling (most of these tests' time) takes half as long as with four.
VLLM_SHAPE = dict(head_dim=64, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=2)
# Of different lengths, so that vLLM packs them into one batch of several sequences.
PROMPTS = [[5, 17, 99, 230, 41, 8], [300, 12], [44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56], [128]]
NEW_TOKENS = 8
ENGINE = dict(max_model_len=256, max_num_seqs=8, kv_cache_memory_bytes=64 << 20, seed=0, trust_remote_code=True)
# How far 16-bit prompt log-probabilities (of magnitude about 6) may be from float32's: seen up to 0.04 in bfloat16
# and 0.005 in float16.
HALF_PRECISION_ATOL = {"bfloat16": 0.1, "float16": 0.02}
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def greedy_new_tokens(model, prompt: list[int]) -> list[int]:
    """`generate`'s greedy continuation of `prompt`, `NEW_TOKENS` long whatever it generates."""
    with torch.no_grad():
        ids = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
                             pad_token_id=2)
    return ids[0, len(prompt):].tolist()


def prompt_logprobs(model, prompt: list[int]) -> list[float]:
    """The log-probability of each prompt token after the first given the tokens before it, in float32."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, :-1].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(prompt[1:])[:, None])[:, 0].tolist()


def without_routing(model):
    """A copy of `model` with every routing query and gate zeroed: plain Qwen3 in the delta modes, uniform routing in
    the AttnRes modes."""
    zeroed = copy.deepcopy(model)
    with torch.no_grad():
        for name, param in zeroed.named_parameters():
            if "_route." in name and not name.endswith("norm.weight"):
                param.zero_()
    return zeroed


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tokenizer) -> dict:
    """Per name (each routing mode, and "qwen3", a plain Qwen3 of the same shape): the checkpoint, with a tokenizer
    that has a chat template, and the model it holds."""
    root = tmp_path_factory.mktemp("vllm")
    chat_tokenizer = copy.deepcopy(tokenizer)
    chat_tokenizer.chat_template = CHAT_TEMPLATE
    made = {}
    for mode in ROUTING_MODES:
        model = save_random_delta(root / mode, mode, **VLLM_SHAPE)
        chat_tokenizer.save_pretrained(root / mode)
        made[mode] = (root / mode, model)
    save_tiny_qwen3(root / "qwen3", chat_tokenizer, initializer_range=0.1, **VLLM_SHAPE)
    made["qwen3"] = (root / "qwen3", Qwen3ForCausalLM.from_pretrained(root / "qwen3").eval())
    return made


@pytest.fixture(scope="module")
def several_layers_per_block(tmp_path_factory, tokenizer) -> dict:
    """A random delta_block checkpoint of four layers in two blocks, so that a block's delta spans two layers (the
    other checkpoints' blocks are one layer each), in the same form as `checkpoints`."""
    path = tmp_path_factory.mktemp("vllm-blocks") / "delta_block-2-layers-per-block"
    model = save_random_delta(path, "delta_block", **VLLM_SHAPE | {"num_hidden_layers": 4})
    tokenizer.save_pretrained(path)
    return {path.name: (path, model)}


@pytest.fixture(scope="module")
def gates_0d(tmp_path_factory, tokenizer) -> dict:
    """A random gated delta_block checkpoint of the format's first version (SPEC section 4: its gates 0-d), in the
    same form as `checkpoints`."""
    path = tmp_path_factory.mktemp("vllm-0d-gates") / "delta_block-0d-gates"
    model = save_random_delta(path, "delta_block", **VLLM_SHAPE)
    write_scalar_gates(path)
    assert gate_shapes(path) == {()}
    tokenizer.save_pretrained(path)
    return {path.name: (path, model)}


def run_vllm(runs: list[dict], tmp_path: Path, enforce_eager: bool, timeout: int = 600) -> dict:
    """Run `benchmarks/vllm_runner.py` on `runs` in the vLLM environment, without this project; its results."""
    tmp_path.mkdir(exist_ok=True)
    job, results = tmp_path / "job.json", tmp_path / "results.json"
    job.write_text(json.dumps({"engine": ENGINE | {"enforce_eager": enforce_eager}, "runs": runs}))
    code = f"""
    import runpy, sys
    sys.argv = [{str(RUNNER)!r}, {str(job)!r}, {str(results)!r}]
    runpy.run_path(sys.argv[0], run_name="__main__")
    """
    run_without_project(code, cwd=tmp_path, timeout=timeout, python=VLLM_PYTHON,
                        env={"VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")})
    return json.loads(results.read_text())


def token_runs(checkpoints: dict) -> list[dict]:
    return [
        {"name": name, "model": str(path), "dtype": "float32", "prompts": PROMPTS, "max_tokens": NEW_TOKENS,
         "prompt_logprobs": 0}
        for name, (path, _) in checkpoints.items()
    ]


def assert_same_as_generate(checkpoints: dict, results: dict, label: str = "") -> None:
    for name, (_, model) in checkpoints.items():
        assert results[name]["architecture"] == ("Qwen3ForCausalLM" if name == "qwen3" else "TransformersForCausalLM")
        assert results[name]["tokens"] == [greedy_new_tokens(model, prompt) for prompt in PROMPTS], (label, name)
        expected = [prompt_logprobs(model, prompt) for prompt in PROMPTS]
        for got, want in zip(results[name]["prompt_logprobs"], expected):
            torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=1e-4, rtol=0)


def test_zeroed_routing_changes_the_tokens(checkpoints):
    """So that equal tokens from vLLM show that it computed the routing."""
    for mode in ROUTING_MODES:
        model = checkpoints[mode][1]
        tokens = [greedy_new_tokens(model, prompt) for prompt in PROMPTS]
        assert tokens != [greedy_new_tokens(without_routing(model), prompt) for prompt in PROMPTS], mode


# Per vLLM mode, an engine start per pair (compiling is most of the default mode's time): in eager mode a delta and
# an AttnRes mode, each in one 16-bit dtype; in the default mode, one. The default mode refuses delta_block on the CPU
# (test_default_mode_refuses_delta_block).
HALF_PRECISION_RUNS = {
    "default": (("delta", "bfloat16"),),
    "eager": (("delta_block", "bfloat16"), ("attnres_full", "float16")),
}
# Compiled by vLLM's default mode: a delta mode and an AttnRes mode (the block one, whose sources change within a
# layer), and the control; eager mode serves every mode.
COMPILED = ("delta", "attnres_block", "qwen3")


def half_precision_runs(checkpoints: dict, vllm_mode: str) -> list[dict]:
    return [
        {"name": f"{mode}-{dtype}", "model": str(checkpoints[mode][0]), "dtype": dtype, "prompts": PROMPTS,
         "max_tokens": 1, "prompt_logprobs": 0}
        for mode, dtype in HALF_PRECISION_RUNS[vllm_mode]
    ]


def assert_half_precision_close_to_float32(checkpoints: dict, results: dict, vllm_mode: str) -> None:
    for mode, dtype in HALF_PRECISION_RUNS[vllm_mode]:
        expected = [prompt_logprobs(checkpoints[mode][1], prompt) for prompt in PROMPTS]
        for got, want in zip(results[f"{mode}-{dtype}"]["prompt_logprobs"], expected, strict=True):
            torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=HALF_PRECISION_ATOL[dtype], rtol=0)


def test_greedy_tokens_equal_generate_in_default_and_eager_modes(checkpoints, several_layers_per_block, gates_0d,
                                                                 tmp_path):
    """Every routing mode and the plain Qwen3 control (served by vLLM's own Qwen3), in float32: the same tokens and
    prompt log-probabilities as Transformers, for prompts of different lengths packed into one batch; in bfloat16 or
    float16 (a delta mode in one, an AttnRes mode in the other), prompt log-probabilities close to float32's. In
    eager mode (the routing through the buffer), every mode, blocks of several layers and a checkpoint with 0-d gates
    too; in vLLM's default mode, which compiles the model with torch.compile(fullgraph=True) (the routing through the
    "compiled" routing implementation), `COMPILED` (delta_block refuses it on the CPU). The two engines run side by
    side: compiling is most of the default mode's time, and it leaves the other core to the eager one."""
    compiled = {name: checkpoints[name] for name in COMPILED}
    served = {"default": compiled, "eager": checkpoints | several_layers_per_block | gates_0d}
    with concurrent.futures.ThreadPoolExecutor(len(served)) as pool:
        futures = {
            mode: pool.submit(run_vllm, token_runs(made) + half_precision_runs(checkpoints, mode), tmp_path / mode,
                              enforce_eager=mode == "eager")
            for mode, made in served.items()
        }
        results = {mode: future.result() for mode, future in futures.items()}
    for mode, made in served.items():
        assert_same_as_generate(made, results[mode], mode)
        assert_half_precision_close_to_float32(checkpoints, results[mode], mode)


def test_default_mode_refuses_delta_block(checkpoints, tmp_path):
    """vLLM's compiled mode on the CPU computes wrong delta_block tokens without an error
    (tests/serving/test_inductor_mutation_order.py), so the model refuses to be built for it, with one line that
    says what to do instead, before anything is compiled."""
    with pytest.raises(AssertionError) as failure:
        run_vllm(token_runs({"delta_block": checkpoints["delta_block"]}), tmp_path, enforce_eager=False)
    assert (
        "ValueError: DeltaQwen3 in routing_mode='delta_block' cannot be served by vLLM's compiled mode on the CPU "
        "with PyTorch 2.13.0+cpu: its Inductor miscompiles it there (wrong tokens, no error; fixed in PyTorch 2.14); "
        "serve it with --enforce-eager (LLM(..., enforce_eager=True))\n"
    ) in str(failure.value)
    assert not (tmp_path / "vllm-cache" / "torch_compile_cache").exists()


def free_loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def post_json(url: str, body: dict, timeout: float = 120) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def wait_until_healthy(server: subprocess.Popen, url: str, timeout: float) -> None:
    """Wait for the server's health endpoint to answer; fails early, with its log, if it exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"the server exited ({server.returncode}):\n{server.stdout.read()[-5000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(1)
    pytest.fail(f"the server did not answer within {timeout} s")


@pytest.fixture
def served(checkpoints, tmp_path):
    """The random delta_block checkpoint served by vLLM's OpenAI-compatible server on a free loopback port, in eager
    mode (the default mode's compilation is tested above, and would make most of this test's time); yields the
    server's base URL, and stops the server after the test."""
    port = free_loopback_port()
    command = [
        str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(checkpoints["delta_block"][0]),
        "--served-model-name", "delta", "--trust-remote-code", "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", str(ENGINE["max_model_len"]), "--max-num-seqs", "8",
        "--kv-cache-memory-bytes", str(ENGINE["kv_cache_memory_bytes"]), "--seed", "0", "--enforce-eager",
    ]
    env = isolated_env() | {"VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")}
    server = subprocess.Popen(command, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        wait_until_healthy(server, f"http://127.0.0.1:{port}/health", timeout=300)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_server_answers_eight_concurrent_requests(checkpoints, tokenizer, served):
    """Six completions and two chat completions at once, of different lengths: each is tokenized as Transformers
    tokenizes it and answers `generate`'s greedy tokens and their text."""
    model = checkpoints["delta_block"][1]
    chat_tokenizer = copy.deepcopy(tokenizer)
    chat_tokenizer.chat_template = CHAT_TEMPLATE
    texts = ["def", "import os", "The for statement", "class A:", "x = [1, 2, 3]\nprint(x)", "Lambda expressions"]
    chats = [[{"role": "user", "content": "What is a list?"}], [{"role": "user", "content": "Hi"}]]
    sampling = {"model": "delta", "max_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True,
                "return_token_ids": True}
    requests = [("/completions", {"prompt": text} | sampling) for text in texts]
    requests += [("/chat/completions", {"messages": messages} | sampling) for messages in chats]
    prompts = [tokenizer(text).input_ids for text in texts]
    prompts += [chat_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                   return_dict=False) for messages in chats]
    expected = [greedy_new_tokens(model, prompt) for prompt in prompts]

    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        answers = list(pool.map(lambda request: post_json(served + request[0], request[1]), requests))
    completions, chat_answers = answers[: len(texts)], answers[len(texts):]
    assert [answer["choices"][0]["prompt_token_ids"] for answer in completions] == prompts[: len(texts)]
    assert [answer["prompt_token_ids"] for answer in chat_answers] == prompts[len(texts):]
    assert [answer["choices"][0]["token_ids"] for answer in answers] == expected
    assert len({tuple(tokens) for tokens in expected}) == len(expected)  # the answers cannot pass by being alike
    got = [answer["choices"][0]["text"] for answer in completions]
    got += [answer["choices"][0]["message"]["content"] for answer in chat_answers]
    # A text ends before the bytes of a character that its last tokens leave unfinished.
    assert got == [tokenizer.decode(tokens, skip_special_tokens=True).rstrip("\ufffd") for tokens in expected]
