"""Writing evaluation results: JSON for machines, a Markdown table for people."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hf_sentcl.common.tables import markdown_table
from hf_sentcl.evaluation.sts import STS_TASKS
from hf_sentcl.evaluation.transfer import TRANSFER_TASKS

# keys of a run's results.json ("sts", "transfer") -> labels of its tables and plots
RUN_LABELS = {"before": "before training", "after": "after training"}
SHORT_NAMES = {"STSBenchmark": "STS-B", "SICKRelatedness": "SICK-R", "SST2": "SST-2", "MRPC_F1": "MRPC F1"}


def sts_markdown_table(rows: dict[str, dict[str, float]], mode: str) -> str:
    """A Markdown table with one row per labelled result dict (Spearman x 100) and the averaging mode named."""
    tasks = [t for t in (*STS_TASKS, "Avg") if any(t in r for r in rows.values())]
    body = ([label, *(f"{result[t]:.2f}" if t in result else "" for t in tasks)] for label, result in rows.items())
    lines = markdown_table(["", *(SHORT_NAMES.get(t, t) for t in tasks)], body)
    lines.append("")
    lines.append(f"Spearman correlation x 100 of cosine similarity; STS12-16 subsets combined with mode `{mode}`.")
    return "\n".join(lines)


def embedding_note(encoder) -> str:
    """The line under a run's tables saying how every row embeds a sentence: the encoder's evaluation pooling and
    head, which its saved copy keeps. So a "before training" row is the untouched model embedded that way."""
    config = encoder.config
    pooling = config.active_pooling(training=False)
    head = config.head != "none" and config.head_at_inference and pooling != "cls_before_pooler"
    return f"Sentence vectors in every row: `{pooling}` pooling, " + (f"`{config.head}` head." if head else "no head.")


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
    body = ([label, *(f"{result[t]:.2f}" if t in result else "" for t in tasks)] for label, result in rows.items())
    lines = markdown_table(["", *(SHORT_NAMES.get(t, t) for t in tasks)], body)
    if note:
        lines += ["", TRANSFER_NOTE]
    return "\n".join(lines)


def write_json(path: str | Path, content: Any, **kwargs: Any) -> Path:
    """Write `content` as indented JSON (parent folders created). NaN and infinity are refused with a ValueError,
    since they would make the file invalid JSON for every other reader. The file is replaced in one step, so a
    crash mid-write leaves the old file or the new one, never half of one (reruns trust a results.json)."""
    path = Path(path)
    text = json.dumps(content, indent=2, allow_nan=False, **kwargs) + "\n"  # fails before the file is touched
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)
    return path


def read_json(path: str | Path) -> Any:
    """The content of a JSON file; ValueError naming the file when it is missing or not JSON."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"'{path}' does not exist.")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"'{path}' is not a JSON file: {err}") from None


def write_report(json_path: str | Path, content: Any, table: str, **json_kwargs: Any) -> tuple[Path, Path]:
    """Write `content` as JSON to `json_path` and the Markdown `table` beside it (same name, `.md`); return both."""
    json_path = write_json(json_path, content, **json_kwargs)
    md_path = json_path.with_suffix(".md")
    md_path.write_text(table + "\n")
    return json_path, md_path


def write_results(output_dir: str | Path, results: dict[str, Any], table: str) -> tuple[Path, Path]:
    """Write a run's `results.json` and `results.md` into `output_dir`; return both paths."""
    return write_report(Path(output_dir) / "results.json", results, table)
