"""Writing evaluation results: JSON for machines, a Markdown table for people."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hf_sentcl.evaluation.sts import STS_TASKS
from hf_sentcl.evaluation.transfer import TRANSFER_TASKS

# keys of a run's results.json ("sts", "transfer") -> labels of its tables and plots
RUN_LABELS = {"before": "before training", "after": "after training"}
SHORT_NAMES = {"STSBenchmark": "STS-B", "SICKRelatedness": "SICK-R", "SST2": "SST-2", "MRPC_F1": "MRPC F1"}


def sts_markdown_table(rows: dict[str, dict[str, float]], mode: str) -> str:
    """A Markdown table with one row per labelled result dict (Spearman x 100) and the averaging mode named."""
    tasks = [t for t in (*STS_TASKS, "Avg") if any(t in r for r in rows.values())]
    header = "| | " + " | ".join(SHORT_NAMES.get(t, t) for t in tasks) + " |"
    rule = "|---|" + "---:|" * len(tasks)
    lines = [header, rule]
    for label, result in rows.items():
        cells = [f"{result[t]:.2f}" if t in result else "" for t in tasks]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"Spearman correlation x 100 of cosine similarity; STS12-16 subsets combined with mode `{mode}`.")
    return "\n".join(lines)


TRANSFER_NOTE = (
    "Test accuracy (%) of a logistic-regression probe on the frozen sentence vectors (SentEval protocol: nested "
    "stratified k-fold CV for MR/CR/SUBJ/MPQA, the given splits otherwise); MRPC F1 is the F1 of the paraphrase "
    "class; Avg is the mean accuracy."
)


def transfer_markdown_table(transfer: Mapping[str, Any], note: bool = True) -> str:
    """A Markdown table of transfer results: `{task: acc}` (one row) or `{label: {task: acc}}` (a row per label).

    Columns follow `TRANSFER_TASKS`, then `MRPC_F1` and `Avg`; any other key gets a column after them. `note`
    appends a line saying what the numbers are.
    """
    rows = transfer if all(isinstance(v, Mapping) for v in transfer.values()) else {"accuracy": transfer}
    known = [t for t in (*TRANSFER_TASKS, "MRPC_F1", "Avg") if any(t in r for r in rows.values())]
    tasks = known + [t for t in dict.fromkeys(k for r in rows.values() for k in r) if t not in known]
    lines = ["| | " + " | ".join(SHORT_NAMES.get(t, t) for t in tasks) + " |", "|---|" + "---:|" * len(tasks)]
    for label, result in rows.items():
        lines.append(f"| {label} | " + " | ".join(f"{result[t]:.2f}" if t in result else "" for t in tasks) + " |")
    if note:
        lines += ["", TRANSFER_NOTE]
    return "\n".join(lines)


def write_results(output_dir: str | Path, results: dict[str, Any], table: str) -> tuple[Path, Path]:
    """Write `results.json` and `results.md` into `output_dir`; return both paths."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    json_path = output_dir / "results.json"
    md_path = output_dir / "results.md"
    json_path.write_text(json.dumps(results, indent=2, allow_nan=False) + "\n")
    md_path.write_text(table + "\n")
    return json_path, md_path
