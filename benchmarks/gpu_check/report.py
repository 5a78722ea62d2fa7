"""The report: the settings and packages of the run, and the table printed at the end (written to gpu_check.md):
per section its status, time, checks passed and the check closest to its limit, and every figure beside its goal."""

from __future__ import annotations

import importlib.metadata
import math
import platform
import sys
from typing import TYPE_CHECKING

import torch

from benchmarks.gpu_check.profiles import Profile

if TYPE_CHECKING:
    from benchmarks.gpu_check.running import Run


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(profile: Profile, rehearsal: bool) -> dict:
    import transformers

    gpu = torch.cuda.get_device_name() if profile.device == "cuda" else None
    packages = ("triton", "fla-core", "flash-attn", "vllm", "accelerate")
    return {"rehearsal": rehearsal, "device": profile.device, "gpu": gpu, "python": platform.python_version(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
            **{name: package_version(name) for name in packages}}  # fmt: skip


def worst_check(data: dict) -> str:
    """The check closest to failing, or the first that failed, in words."""
    failed = [check for check in data.get("checks", []) if not check["pass"]]

    def margin(check) -> float:
        value, limit = check["value"], check["limit"]
        if check["passes_if"] == "value >= limit":
            return limit / value if value > 0 else math.inf
        return value / limit if limit > 0 else (0.0 if value == 0 else math.inf)

    checks = failed or sorted(data.get("checks", []), key=margin)[-1:]
    if not checks:
        return ""
    check = checks[0]
    sign = ">=" if check["passes_if"] == "value >= limit" else "<="
    verdict = "failed" if not check["pass"] else "closest"
    return f"{verdict}: {check['name']} = {check['value']:.3g} (needs {sign} {check['limit']:.3g})"


def summary(data: dict) -> str:
    """A section's last column: why it stopped; else, where it has goals and no failed check, how many it met and
    which parts it did not run; else its worst check."""
    goals, checks = data.get("goals", []), data.get("checks", [])
    if data.get("reason") or not goals or not all(check["pass"] for check in checks):
        return data.get("reason") or worst_check(data)
    not_run = f"; not run: {', '.join(data['not_run'])}" if data.get("not_run") else ""
    return f"goals met: {sum(goal['met'] for goal in goals)} of {len(goals)} (below){not_run}"


def markdown_table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    lines.insert(1, "|" + "---|" * len(rows[0]))
    return "\n".join(lines)


def goals_table(run: Run) -> str:
    """Every figure that has a goal, beside it (reported, not checked); empty when none was measured."""
    rows = [["figure", "value", "goal", "met"]]
    for data in run.sections().values():
        rows += [[goal["name"], f"{goal['value']:.3f}", f"{goal['passes_if'].split()[1]} {goal['goal']:g}",
                  "yes" if goal["met"] else "no"] for goal in data.get("goals", [])]  # fmt: skip
    return f"\nGoals (reported, not checked):\n\n{markdown_table(rows)}\n" if len(rows) > 1 else ""


def table(run: Run) -> str:
    rows = [["section", "status", "seconds", "budget", "checks", "worst check, or why"]]
    for name, data in run.sections().items():
        checks = data.get("checks", [])
        passed = sum(check["pass"] for check in checks)
        rows.append([name, data["status"], str(data.get("seconds", "")), f"{data['budget_seconds']:.0f}",
                     f"{passed}/{len(checks)}", summary(data)])  # fmt: skip
    verdict = "all sections passed or were skipped" if run.report.get("passed") else "some sections did not pass"
    return f"{markdown_table(rows)}\n\n{verdict}; details in {run.out / 'gpu_check.json'}\n{goals_table(run)}"


def write_table(run: Run) -> None:
    text = table(run)
    (run.out / "gpu_check.md").write_text(text)
    print(text, file=sys.__stdout__, flush=True)
