"""A run's own export card carries the recipe's `license` and `language`; a license mteb and the Hub do not know is
refused before the model loads."""

from __future__ import annotations

import pytest
from huggingface_hub import ModelCard
from test_progress import run, write_recipe

from hf_sentcl.common import exits

pytestmark = pytest.mark.slow


def test_a_runs_license_and_language_reach_its_card(tmp_path, tiny_bert_dir, senteval_dir):
    recipe = write_recipe(tmp_path, tiny_bert_dir, senteval_dir, eval_before_training="false",
                          license="apache-2.0", language="[de, en]")
    done = run(recipe, tmp_path / "out")
    assert done.returncode == 0, done.stderr[-3000:]
    data = ModelCard.load(tmp_path / "out" / "export" / "README.md").data
    assert data.license == "apache-2.0" and data.language == ["de", "en"]


def test_an_unknown_license_is_refused_before_work(tmp_path, tiny_bert_dir, senteval_dir):
    done = run(write_recipe(tmp_path, tiny_bert_dir, senteval_dir), tmp_path / "out", "--license", "apache-9")
    assert done.returncode == exits.BAD_INPUT and "key 'license': 'apache-9' is not a license" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out").exists()
