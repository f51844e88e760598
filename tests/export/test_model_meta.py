"""`model_meta.py`, the ModelMeta a contributor adds to mteb's model registry: written beside the results folder
from the same values as `model_meta.json`, imported and checked with mteb, loadable offline, rekeyed by a push."""

import json

import mteb
import numpy as np
import pytest
from datasets import Dataset
from mteb.models import ModelMeta
from mteb.models.sentence_transformer_wrapper import SentenceTransformerEncoderWrapper
from sentence_transformers import SentenceTransformer
from torch.utils.data import DataLoader

from hf_sentcl import SentenceEncoder
from hf_sentcl.cli.export import main as export_main
from hf_sentcl.evaluation.mteb import NO_REVISION
from hf_sentcl.evaluation.sts import STS_TASKS
from hf_sentcl.export.bundle import export_mteb_results, export_with_card
from hf_sentcl.export.mteb_files import check_mteb_submission, rekey_mteb_results
from hf_sentcl.export.mteb_meta import import_model_meta, parameter_count
from hf_sentcl.registry import METHODS

SENTENCES = ["a man plays the guitar .", "the cat runs in the park .", "a girl eats food ."]
TRAINING_CODE = "https://github.com/example/hf_sentcl"
SCORES = {task: 70.0 + i for i, task in enumerate(STS_TASKS)}
RESULTS = {  # a Matryoshka run on STS-B's texts, fine-tuned from the embedded MiniLM
    "method": "simcse", "model_name_or_path": "embedded:all-MiniLM-L6-v2", "mteb_sts": SCORES,
    "sts_by_dim": {"after": {"16": SCORES, "8": SCORES}}, "training_data": {"source": "unlabeled_sts", "name": "stsb"},
}


@pytest.fixture
def exported(tiny_bert_dir, tmp_path):
    """A real export of the tiny BERT and its MTEB files under `mt/`; returns (export folder, revision folder)."""
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean").eval()
    out = tmp_path / "out"
    plan, _ = export_with_card(encoder, out, {}, verify=False)
    folder = export_mteb_results(tmp_path / "mt", RESULTS, out, plan, "my-org/SimCSE-tiny", license_id="apache-2.0",
                                 training_code=TRAINING_CODE)
    return out, folder


def test_model_meta_module_imports_with_mteb_and_equals_the_json(exported):
    out, folder = exported
    root = folder.parents[2]
    assert folder == root / "results" / "my-org__SimCSE-tiny" / NO_REVISION
    assert not (folder / "model_meta.py").exists()  # the folder copied into the results repository stays JSON only
    text = (root / "model_meta.py").read_text()
    assert "\nmy_org__simcse_tiny = ModelMeta(\n" in text and "model_implementations/my_org_models.py" in text
    meta = import_model_meta(root / "model_meta.py")
    assert isinstance(meta, ModelMeta) and meta.loader is SentenceTransformerEncoderWrapper
    assert (meta.name, meta.revision, meta.reference) == (
        "my-org/SimCSE-tiny", NO_REVISION, "https://huggingface.co/my-org/SimCSE-tiny")
    assert meta.embed_dim == [8, 16, 32] and meta.max_tokens == 64 and meta.similarity_fn_name == "cosine"
    config = json.loads((out / "config.json").read_text())
    assert meta.n_parameters == parameter_count(out)[0] and meta.n_embedding_parameters == config["vocab_size"] * 32
    assert (meta.license, meta.public_training_code) == ("apache-2.0", TRAINING_CODE)
    assert meta.public_training_data == "https://huggingface.co/datasets/mteb/stsbenchmark-sts"
    base = mteb.get_model_meta("sentence-transformers/all-MiniLM-L6-v2", fetch_from_hf=False)
    assert meta.training_datasets == {"STSBenchmark"} | base.get_training_datasets()  # its own data + its base's
    assert meta.adapted_from == "sentence-transformers/all-MiniLM-L6-v2"
    assert meta.citation == METHODS["simcse"].paper.bibtex
    assert meta.framework == ["Sentence Transformers", "PyTorch"] and meta.languages == ["eng-Latn"]
    saved = json.loads((folder / "model_meta.json").read_text())
    assert saved["loader"] == "SentenceTransformerEncoderWrapper" and saved["embed_dim"] == 32  # mteb's to_dict
    # what mteb's own tests ask of a new model in its registry
    assert meta.n_embedding_parameters is not None and meta.revision is not None and meta.name != meta.adapted_from
    assert "STSBenchmark" in meta.get_training_datasets()
    checked, tasks = check_mteb_submission(folder)
    assert checked == meta and tasks == ["SICK-R", "STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark"]


def test_loader_builds_the_model_offline_from_the_export(exported):
    """The module's loader, given the export folder instead of the Hub id, encodes as sentence-transformers does
    (loading by the Hub id needs the pushed repository and the network)."""
    out, folder = exported
    meta = import_model_meta(folder.parents[2] / "model_meta.py")
    model = meta.model_copy(update={"name": str(out)}).load_model()
    assert isinstance(model, SentenceTransformerEncoderWrapper)
    embeddings = model.encode(DataLoader(Dataset.from_dict({"text": SENTENCES}), batch_size=2),
                              task_metadata=mteb.get_task("STS12").metadata, hf_split="test", hf_subset="default")
    expected = SentenceTransformer(str(out), device="cpu").encode(SENTENCES)
    np.testing.assert_allclose(np.asarray(embeddings), expected, atol=1e-5)


def test_mismatches_are_refused_naming_the_file_and_field(exported):
    _out, folder = exported
    module = folder.parents[2] / "model_meta.py"
    text = module.read_text()
    module.write_text(text.replace("license='apache-2.0'", "license='mit'"))
    with pytest.raises(ValueError, match=r"model_meta.py' does not match .*model_meta.json'.*field 'license'"):
        check_mteb_submission(folder)
    module.write_text(text.replace("languages=['eng-Latn']", "languages=['english']"))
    with pytest.raises(ValueError, match="model_meta.py' does not import with mteb"):  # pydantic's validation
        check_mteb_submission(folder)
    module.write_text(text)
    moved = folder.rename(folder.with_name("0123abcd" * 5))  # the folder no longer names the ModelMeta's revision
    with pytest.raises(ValueError, match=r"ResultCache finds tasks \[\] .* revision no_revision_available"):
        check_mteb_submission(moved)


def test_rekey_writes_the_pushed_revision_into_the_module(exported):
    _out, folder = exported
    root = folder.parents[2]
    moved = rekey_mteb_results(root, "org/pushed", "0123abcd" * 5)
    meta = import_model_meta(root / "model_meta.py")
    assert (meta.name, meta.revision) == ("org/pushed", "0123abcd" * 5)
    assert "\norg__pushed = ModelMeta(\n" in (root / "model_meta.py").read_text()
    assert meta.embed_dim == [8, 16, 32] and meta.license == "apache-2.0"  # what only the module keeps survives
    assert check_mteb_submission(moved)[0] == meta
    (root / "model_meta.py").unlink()  # results written before model_meta.py existed: rebuilt from the JSON
    rekey_mteb_results(root, "org/pushed", "4567cdef" * 5)
    meta = import_model_meta(root / "model_meta.py")
    assert meta.revision == "4567cdef" * 5 and meta.loader is SentenceTransformerEncoderWrapper


def test_cli_refuses_an_unknown_license_before_exporting(tiny_bert_dir, tmp_path, capsys):
    code = export_main([str(tiny_bert_dir), str(tmp_path / "out"), "--pooling", "mean", "--mteb-results",
                        str(tmp_path / "mt"), "--license", "my-own-license", "--no-verify"])
    assert code == 2 and "--license 'my-own-license' is not a license mteb knows" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not (tmp_path / "mt").exists()
