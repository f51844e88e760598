"""benchmarks/cls_last_layer.py runs both routes on a tiny BERT and prints their ratio."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from helpers import random_sentences

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "cls_last_layer.py"


@pytest.mark.parametrize("extra", [[], ["--route", "padded", "--inference"]])
def test_benchmark_times_both_routes(tiny_bert_dir, tmp_path, capsys, extra):
    spec = importlib.util.spec_from_file_location("cls_last_layer", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    corpus = tmp_path / "wiki.txt"
    corpus.write_text("\n".join(random_sentences(6, seed=1, min_words=2, max_words=12)) + "\n")
    assert module.main(["--model", str(tiny_bert_dir), "--train-file", str(corpus), "--precisions", "fp32,bf16",
                        "--batch-size", "4", "--blocks", "2", "--steps-per-block", "1", "--threads", "1", *extra]) == 0
    out = capsys.readouterr().out
    assert len(re.findall(r"full last layer [\d.]+ ms, first positions only [\d.]+ ms .*: [\d.]+x", out)) == 2, out
    assert ("padded route, inference" in out) == bool(extra)
