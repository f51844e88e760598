"""Writing evaluation results: JSON for machines, a Markdown table for people."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hf_sentcl.evaluation.sts import STS_TASKS

SHORT_NAMES = {"STSBenchmark": "STS-B", "SICKRelatedness": "SICK-R"}


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


def write_results(output_dir: str | Path, results: dict[str, Any], table: str) -> tuple[Path, Path]:
    """Write `results.json` and `results.md` into `output_dir`; return both paths."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    json_path = output_dir / "results.json"
    md_path = output_dir / "results.md"
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    md_path.write_text(table + "\n")
    return json_path, md_path
