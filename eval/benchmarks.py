"""The paper's eight zero-shot benchmarks: which lm-eval task runs each, the metric its table reports, and the
fields a local data file must have.

Metric per task (the one `delta-qwen3 eval` reports and averages; lm-eval also reports `acc` where `acc_norm` is
chosen):

| benchmark      | metric   | why                                                                         |
|----------------|----------|-----------------------------------------------------------------------------|
| hellaswag      | acc_norm | endings differ a lot in length; length-normalised log-likelihood is usual   |
| arc_easy       | acc_norm | answer texts differ in length                                               |
| arc_challenge  | acc_norm | answer texts differ in length                                               |
| piqa           | acc_norm | the two solutions differ in length                                          |
| winogrande     | acc      | both options are scored on the same continuation                            |
| boolq          | acc      | the choices are the single words "no" / "yes"                               |
| mmlu           | acc      | the choices are the single letters A-D                                      |
| lambada_openai | acc      | greedy decoding must reproduce the whole last word                          |

The average is the unweighted mean of these eight numbers, like the paper's "Avg" column.
"""

from dataclasses import dataclass
from pathlib import Path

from delta_qwen3.errors import CommandError

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
FIXTURES_DIR = Path(__file__).resolve().parent / "fixtures"
PAPER_GROUP = "delta_qwen3_paper"


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: its name (also its local data file's stem), lm-eval task, reported metric, table heading
    and the document fields its task reads (dotted for nested fields)."""

    name: str
    metric: str
    title: str
    fields: tuple[str, ...]

    @property
    def task(self) -> str:
        return f"dq3_{self.name}"

    @property
    def yaml_path(self) -> Path:
        return TASKS_DIR / f"{self.task}.yaml"

    @property
    def data_file(self) -> str:
        return f"{self.name}.jsonl"


_ARC_FIELDS = ("question", "choices.text", "choices.label", "answerKey")

# In the order of the paper's tables.
BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("hellaswag", "acc_norm", "HellaSwag", ("activity_label", "ctx_a", "ctx_b", "endings", "label")),
    Benchmark("arc_easy", "acc_norm", "ARC-E", _ARC_FIELDS),
    Benchmark("arc_challenge", "acc_norm", "ARC-C", _ARC_FIELDS),
    Benchmark("piqa", "acc_norm", "PIQA", ("goal", "sol1", "sol2", "label")),
    Benchmark("winogrande", "acc", "WinoG", ("sentence", "option1", "option2", "answer")),
    Benchmark("boolq", "acc", "BoolQ", ("question", "passage", "label")),
    Benchmark("mmlu", "acc", "MMLU", ("question", "subject", "choices", "answer")),
    Benchmark("lambada_openai", "acc", "LAMBADA", ("text",)),
)
BY_NAME = {benchmark.name: benchmark for benchmark in BENCHMARKS}


def resolve_benchmarks(tasks: str | list[str]) -> list[Benchmark]:
    """`"paper"` (all eight) or benchmark names, as a list or comma-separated; `dq3_` task names are accepted too."""
    names = tasks.split(",") if isinstance(tasks, str) else list(tasks)
    names = [name.strip() for name in names if name.strip()]
    if names in (["paper"], [PAPER_GROUP]):
        return list(BENCHMARKS)
    if not names:
        raise CommandError("no tasks given")
    chosen = []
    for name in names:
        benchmark = BY_NAME.get(name.removeprefix("dq3_"))
        if benchmark is None:
            known = ", ".join(["paper", *BY_NAME])
            raise CommandError(f"unknown task {name!r}; known tasks: {known}")
        if benchmark not in chosen:
            chosen.append(benchmark)
    return chosen
