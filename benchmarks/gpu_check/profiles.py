"""The two kinds of run, as shapes, sizes and time budgets per section: on a GPU, and the CPU rehearsal."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    """Shapes, sizes and time budgets of one kind of run: on a GPU, or the CPU rehearsal."""

    device: str
    budgets: dict  # seconds per section
    check_shape: dict  # the small model of the correctness sections
    check_tokens: tuple[int, int]  # batch, sequence
    perf_shape: dict
    perf_tokens: tuple[int, int]  # batch, sequence: training and memory
    long_tokens: tuple[int, int]  # training where the GPU's work, not launching it, takes the time
    training_pairs: int  # timed rounds of a training step of each model
    long_training_pairs: int
    decode: tuple[int, int, int]  # prompt, new tokens, rounds: eager decoding
    graph_decode: tuple[int, int, int]  # prompt, new tokens, timed rounds: `generate` under CUDA graphs
    op_calls: int  # timed calls of the routing operation
    compile_backend: str
    compile_modes: tuple[str, ...]  # compiled training in each, generation in the first
    learning: dict  # pre-training steps, warm-up steps, learning rate, batch size, sequence length, model
    threads: int | None = None  # PyTorch's CPU threads, when not its default
    perf_variants: tuple[str, ...] = ("delta_block", "delta")
    compiled_variants: tuple[str, ...] = ("delta_block", "delta")  # in order: compiling takes minutes per model


CHECK_SHAPE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, max_position_embeddings=256, initializer_range=0.02,
                   tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=2)  # fmt: skip

GPU = Profile(
    device="cuda",
    # Room for what takes long on first use: fla's kernels autotune per dtype (implementations), and compiling a
    # training step of the 0.6B shape takes minutes per model (performance); benchmarks/README.md's runs on an H200
    # have the times.
    budgets=dict(implementations=150, attention=20, compile=85, performance=330, learning=60, serving=30),
    check_shape=CHECK_SHAPE | dict(hidden_size=256, intermediate_size=512, head_dim=64, num_hidden_layers=6),
    check_tokens=(2, 64),
    perf_shape={},  # the Qwen3-0.6B shape, from benchmarks/routing_overhead.py (`performance.performance_settings`)
    perf_tokens=(4, 512),
    long_tokens=(8, 4096),
    training_pairs=10,
    long_training_pairs=3,
    decode=(128, 32, 2),
    graph_decode=(128, 128, 5),  # enough steps that the prompt's eager forward pass weighs little
    op_calls=10,
    compile_backend="inductor",
    compile_modes=("delta_block", "delta"),
    learning=dict(steps=200, warmup=20, lr=3e-3, batch=16, seq_len=128, model={}),  # the demo's base model
)
REHEARSAL = Profile(
    device="cpu",
    budgets=dict(implementations=30, attention=15, compile=60, performance=60, learning=60, serving=30),
    check_shape=CHECK_SHAPE | dict(num_hidden_layers=3),  # blocks of two layers and of one
    check_tokens=(2, 11),
    perf_shape=CHECK_SHAPE | dict(num_hidden_layers=2),
    perf_tokens=(2, 32),
    long_tokens=(1, 64),
    training_pairs=1,
    long_training_pairs=1,
    decode=(8, 3, 1),
    graph_decode=(8, 3, 1),
    op_calls=1,
    # Dynamo's tracing of the whole graph (what fullgraph checks) alone: the code AOTAutograd and inductor generate
    # is the GPU run's to check, and slow to generate on a CPU.
    compile_backend="eager",
    compile_modes=("delta_block",),
    learning=dict(steps=20, warmup=2, lr=1e-2, batch=4, seq_len=32,
                  model=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, head_dim=16)),
    # Tiny operations on a loaded machine: a second thread costs more waiting for it than it computes
    # (benchmarks/README.md, "Rehearsal").
    threads=1,
    compiled_variants=("delta_block",),
)
