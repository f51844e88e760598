"""`--sts-tasks` takes the names every table, the model card and MTEB print (STS-B, SICK-R), in any case."""

import json

import pytest

from hf_sentcl import SentenceEncoder
from hf_sentcl.cli.evaluate import main
from hf_sentcl.evaluation.sts import STSEvaluator, canonical_sts_tasks


def test_table_names_are_aliases_of_the_internal_ones():
    assert canonical_sts_tasks(["STS-B", "sick-r", "sts12", "SICKRelatedness", "stsb"]) == [
        "STSBenchmark", "SICKRelatedness", "STS12",
    ]
    with pytest.raises(ValueError, match="STS17"):
        canonical_sts_tasks(["STS-B", "STS17"])


def test_evaluate_accepts_sts_b_and_sick_r(tmp_path, tiny_bert_dir, senteval_dir):
    """`--sts-tasks STS-B,sick-r` scores STSBenchmark and SICKRelatedness (refused with exit 2 before the aliases),
    with the same numbers as the internal names."""
    output = tmp_path / "out.json"
    argv = ["--model", str(tiny_bert_dir), "--data-dir", str(senteval_dir), "--sts-tasks", "STS-B,sick-r",
            "--output", str(output), "--device", "cpu"]
    assert main(argv) == 0
    results = json.loads(output.read_text())
    expected = STSEvaluator(senteval_dir, tasks=("STSBenchmark", "SICKRelatedness"))(
        SentenceEncoder.load(str(tiny_bert_dir))
    )
    for task in ("STSBenchmark", "SICKRelatedness"):
        assert results[task] == pytest.approx(expected[task], abs=1e-4)
    assert "STS-B" in output.with_suffix(".md").read_text()
