"""Issue 36, finding 4: the leaderboard entry an export writes (`model_meta.py` / `model_meta.json`).

It names what the model was trained on (`training_datasets`: the MTEB datasets of its own training data plus the
base model's, so that mteb's zero-shot flag is computed instead of "unknown"), truncates where the base model
does (`max_tokens` = the export's `max_seq_length` = all-MiniLM-L6-v2's 256), cites the method's paper and names
public training code, and says plainly that the results repository takes no results filed under
`no_revision_available` before a push.

The base is the embedded all-MiniLM-L6-v2 (mteb's registry knows its training data), exported once; the two
results dicts are those of a supervised SimCSE run on triplets mined from STS-B's train pairs and of an
unsupervised SimCSE run on Wikipedia sentences, with `training_data` as the run records it
(`training_data_summary`).
"""

import json
import logging
from pathlib import Path

import mteb
import pytest
from helpers import random_sentences, write_yaml_recipe
from sentence_transformers import SentenceTransformer

from hf_sentcl import SentenceEncoder
from hf_sentcl.cli.mine import main as mine_main
from hf_sentcl.configs.choices import EMBEDDED_MODEL_ALIAS
from hf_sentcl.evaluation.mteb import NO_REVISION
from hf_sentcl.evaluation.sts import STS_TASKS
from hf_sentcl.export.bundle import export_mteb_results, export_with_card
from hf_sentcl.export.card import project_code_url
from hf_sentcl.export.mteb_files import check_mteb_submission, rekey_mteb_results, submission_notes
from hf_sentcl.export.mteb_meta import import_model_meta
from hf_sentcl.export.plan import ExportError
from hf_sentcl.export.results import CARD_INPUTS
from hf_sentcl.export.verify import PROBE_SENTENCES
from hf_sentcl.modeling.backbone import resolve_model_name
from hf_sentcl.recipe.metadata import non_default_settings, training_data_summary
from hf_sentcl.recipe.parser import parse_recipe
from hf_sentcl.recipe.plan import plan_run
from hf_sentcl.registry import METHODS

BASE = "sentence-transformers/all-MiniLM-L6-v2"
SCORES = {task: 70.0 + i for i, task in enumerate(STS_TASKS)}
LONG_PROBE = " ".join(random_sentences(60, seed=9))  # ~400 tokens: past 256, so the truncation length matters


@pytest.fixture(scope="module")
def base_meta():
    return mteb.get_model_meta(BASE, fetch_from_hf=False)


@pytest.fixture(scope="module")
def minilm_export(tmp_path_factory):
    """The embedded MiniLM (mean pooling, as it was trained) exported once, verified with a probe longer than 256
    tokens (both loaders and `SentenceEncoder.encode` must truncate alike)."""
    encoder = SentenceEncoder.from_backbone(EMBEDDED_MODEL_ALIAS, pooling="mean").eval()
    out = tmp_path_factory.mktemp("minilm") / "export"
    plan, differences = export_with_card(encoder, out, {}, probes=(*PROBE_SENTENCES[:2], LONG_PROBE))
    assert max(differences.values()) < 1e-4
    return out, plan


def run_results(tmp_path, method, train_file, **extra_data):
    """What a run on `train_file` from the embedded MiniLM records in results.json (the parts the export reads)."""
    recipe = parse_recipe(write_yaml_recipe(
        tmp_path, method=method, model_name_or_path=EMBEDDED_MODEL_ALIAS, train_file=str(train_file),
        pooling="mean", head="none", output_dir=str(tmp_path / "run"),
    ))
    columns = ["sent0", "sent1", "hard_neg"] if method == "simcse_sup" else ["text"]
    data = training_data_summary(plan_run(recipe).stages[-1], 32, columns)
    return {"method": method, "model_name_or_path": EMBEDDED_MODEL_ALIAS, "mteb_sts": SCORES,
            "recipe_settings": non_default_settings(recipe), "training_data": {**data, **extra_data}}


def export_entry(tmp_path, minilm_export, results, repo_id):
    out, plan = minilm_export
    folder = export_mteb_results(tmp_path / "mt", results, out, plan, repo_id, license_id="apache-2.0")
    root = folder.parents[2]
    return import_model_meta(root / "model_meta.py"), root, folder


def assert_common(meta, minilm_export, base_meta):
    """Length, base model, citation and code: the same for both runs (SimCSE from all-MiniLM-L6-v2)."""
    out, plan = minilm_export
    base = Path(resolve_model_name(EMBEDDED_MODEL_ALIAS))
    base_length = json.loads((base / "sentence_bert_config.json").read_text())["max_seq_length"]  # ST 2.x layout
    assert base_length == 256 and base_meta.max_tokens == 256
    assert json.loads((base / "tokenizer_config.json").read_text())["model_max_length"] == 512  # not the limit
    # sentence-transformers 6 keeps the limit as the tokenizer's model_max_length
    exported = json.loads((out / "tokenizer_config.json").read_text())["model_max_length"]
    assert exported == plan.max_seq_length == meta.max_tokens == base_length
    assert SentenceTransformer(str(out), device="cpu").max_seq_length == 256
    assert meta.adapted_from == BASE
    assert meta.citation == METHODS["simcse"].paper.bibtex
    code = project_code_url() or METHODS["simcse"].paper.code  # hf_sentcl's repository once pyproject names it
    assert code is not None and meta.public_training_code == code


def test_entry_of_a_model_trained_on_triplets_mined_from_stsb(tmp_path, tiny_bert_dir, senteval_dir, minilm_export,
                                                              base_meta, capsys):
    mined = tmp_path / "stsb_mined.csv"
    assert mine_main(["--model", str(tiny_bert_dir), "--pooling", "mean", "--pairs", "stsb:train", "--min-score", "0",
                      "--data-dir", str(senteval_dir), "--output", str(mined)]) == 0
    # the run reads the file's origin from the sidecar `hf-sentcl mine --pairs stsb:train` wrote beside it
    results = run_results(tmp_path, "simcse_sup", mined)
    assert results["training_data"]["name"] == "stsb_mined.csv"
    assert results["training_data"]["mteb_datasets"] == {"STSBenchmark": ["train"]}
    meta, root, _folder = export_entry(tmp_path, minilm_export, results, "my-org/simcse-sup-stsb-mined")

    assert meta.training_datasets == {"STSBenchmark"} | base_meta.get_training_datasets()
    own_only = meta.model_copy(update={"training_datasets": {"STSBenchmark"}, "adapted_from": None})
    assert meta.get_training_datasets() == own_only.get_training_datasets() | base_meta.get_training_datasets()
    assert meta.is_zero_shot_on(["STSBenchmark"]) is False  # trained on STS-B's train split
    assert meta.is_zero_shot_on(["STS12"]) is True
    assert_common(meta, minilm_export, base_meta)
    module = (root / "model_meta.py").read_text()
    assert "#   - stsb_mined.csv (train_file): built from MTEB's STSBenchmark (train)" in module
    print("mined STS-B:", sorted(meta.get_training_datasets()), "zero-shot on STSBenchmark:",
          meta.is_zero_shot_on(["STSBenchmark"]))


def test_entry_of_a_model_trained_on_wikipedia_text(tmp_path, minilm_export, base_meta):
    wiki = tmp_path / "wiki1m_for_simcse.txt"
    wiki.write_text("\n".join(random_sentences(64, seed=5)) + "\n")
    results = run_results(tmp_path, "simcse", wiki)
    meta, root, folder = export_entry(tmp_path, minilm_export, results, "my-org/simcse-wiki")

    # Wikipedia is no MTEB dataset: the model's MTEB training data is its base model's, and that is now known
    assert meta.training_datasets == base_meta.get_training_datasets()
    assert meta.get_training_datasets() == base_meta.get_training_datasets()
    assert meta.is_zero_shot_on(["STSBenchmark"]) is True
    assert meta.public_training_data is None  # a local file is not credited to a Hub dataset by its name
    assert_common(meta, minilm_export, base_meta)
    module = (root / "model_meta.py").read_text()
    assert ("# Also trained on (not in mteb, so not in training_datasets):\n"
            "#   - wiki1m_for_simcse.txt (train_file)\n") in module
    assert check_mteb_submission(folder)[0] == meta  # the module still equals model_meta.json
    print("Wikipedia:", sorted(meta.get_training_datasets()), "zero-shot on STSBenchmark:",
          meta.is_zero_shot_on(["STSBenchmark"]))


def test_checks_say_an_unpushed_revision_is_not_accepted(tmp_path, minilm_export, caplog):
    wiki = tmp_path / "wiki1m_for_simcse.txt"
    wiki.write_text("\n".join(random_sentences(64, seed=5)) + "\n")
    with caplog.at_level(logging.WARNING, logger="hf_sentcl"):
        meta, root, folder = export_entry(tmp_path, minilm_export, run_results(tmp_path, "simcse", wiki), "o/m")
    assert meta.revision == NO_REVISION
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "MTEB's results repository will not take these results under this revision" in said
    assert f"hf-sentcl push EXPORT --repo-id o/m --mteb-results {root}" in said
    (note,) = submission_notes(check_mteb_submission(folder)[0], root)
    assert note.startswith("revision 'no_revision_available': ")
    caplog.clear()
    moved = rekey_mteb_results(root, "o/m", "0123abcd" * 5)
    assert submission_notes(check_mteb_submission(moved)[0]) == [] and "will not take" not in caplog.text
    # the rewritten module keeps the training-data comment
    assert "#   - wiki1m_for_simcse.txt (train_file" in (root / "model_meta.py").read_text()


def test_a_chained_run_names_the_first_stage_data_and_the_original_base(tmp_path, tiny_bert_dir):
    """ConSERT sup-unsup / joint-unsup: stage 2 starts from stage 1's export (a local folder), whose card inputs
    hold stage 1's results: the entry's base is the original Hub model and the NLI pairs are named."""
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean").eval()
    out = tmp_path / "out"
    plan, _ = export_with_card(encoder, out, {}, verify=False)
    stage_one = tmp_path / "run" / "stage-1" / "export"
    stage_one.mkdir(parents=True)
    (stage_one / CARD_INPUTS).write_text(json.dumps({"results": {
        "method": "consert", "model_name_or_path": EMBEDDED_MODEL_ALIAS,
        "training_data": {"source": "nli_source", "name": "dataset 'stanfordnlp/snli' (train)"},
    }}))
    results = {"method": "consert", "model_name_or_path": str(stage_one), "mteb_sts": SCORES,
               "training_data": {"source": "unlabeled_sts", "name": "all"}}
    folder = export_mteb_results(tmp_path / "mt", results, out, plan, "my-org/consert-sup-unsup")
    meta = import_model_meta(folder.parents[2] / "model_meta.py")
    base = mteb.get_model_meta(BASE, fetch_from_hf=False).get_training_datasets()
    sts = {"STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICK-R"}
    assert meta.adapted_from == BASE and meta.training_datasets == sts | base
    assert meta.citation == METHODS["consert"].paper.bibtex
    assert meta.public_training_code == (project_code_url() or "https://github.com/yym6472/ConSERT")
    assert meta.max_tokens == plan.max_seq_length == 64  # the tiny BERT has no sentence-transformers setting
    assert "#   - dataset 'stanfordnlp/snli' (train) (nli_source, Hub dataset stanfordnlp/snli)" in (
        folder.parents[2] / "model_meta.py").read_text()


@pytest.mark.parametrize("declared", [{"STS-B": ["train"]}, "STSBenchmark"])
def test_a_declaration_mteb_cannot_read_is_refused_before_anything_is_written(tmp_path, tiny_bert_dir, declared):
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean").eval()
    plan, _ = export_with_card(encoder, tmp_path / "out", {}, verify=False)
    results = {"method": "simcse_sup", "model_name_or_path": str(tiny_bert_dir), "mteb_sts": SCORES,
               "training_data": {"source": "train_file", "name": "mined.csv", "mteb_datasets": declared}}
    with pytest.raises(ExportError, match="STS-B'.*not MTEB task names" if isinstance(declared, dict) else
                       "should map MTEB task names to their splits"):
        export_mteb_results(tmp_path / "mt", results, tmp_path / "out", plan, "my-org/m")
    assert not (tmp_path / "mt").exists()
