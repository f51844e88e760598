"""Issue 55 item 1: an export is a drop-in replacement for its base model. all-MiniLM-L6-v2 is
`Transformer -> Pooling -> Normalize`; its export keeps `Normalize`, so `SentenceTransformer(export).encode()` gives the
base pipeline's unit vectors. A base module the export cannot keep (a `Dense` the training never saw, another
pooling) is stated in the card."""

import json
import shutil

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from hf_sentcl import SentenceEncoder
from hf_sentcl.cli.export import main
from hf_sentcl.configs.choices import EMBEDDED_MODEL_ALIAS
from hf_sentcl.export.bundle import export_with_card
from hf_sentcl.export.plan import ExportPlan, plan_export
from hf_sentcl.export.snippets import transformers_snippet
from hf_sentcl.modeling.backbone import resolve_model_name

SENTENCES = [
    "A man is playing a guitar.",
    "Someone plays an instrument on stage while the audience sings along.",
    "The cat sleeps.",
    "Stock markets fell sharply on Monday after the central bank raised interest rates again.",
]


def module_classes(folder) -> list[str]:
    return [entry["type"].rsplit(".", 1)[-1] for entry in json.loads((folder / "modules.json").read_text())]


def card_embed(plan, path):
    """The `embed` function of the card's plain-transformers snippet, run against `path`."""
    namespace: dict = {}
    exec(compile(transformers_snippet(plan, str(path)), "<model card snippet>", "exec"), namespace)
    return lambda sentences: namespace["embed"](sentences).numpy()


def test_untouched_minilm_export_encodes_like_the_base_pipeline(tmp_path, capsys):
    """`hf-sentcl export embedded:all-MiniLM-L6-v2 OUT --pooling mean` (the quickstart's pooling): the modules end in
    Normalize, `SentenceTransformer(OUT).encode` equals `SentenceTransformer(<base>).encode` with unit norms, the
    export's own check passes against `SentenceEncoder.encode(normalize=True)`, and the card's plain-transformers
    snippet gives the same vectors."""
    out = tmp_path / "out"
    assert main([EMBEDDED_MODEL_ALIAS, str(out), "--pooling", "mean"]) == 0
    assert "max |difference| from SentenceEncoder.encode" in capsys.readouterr().out  # verified before it was moved
    assert module_classes(out) == ["Transformer", "Pooling", "Normalize"]

    exported = SentenceTransformer(str(out), device="cpu").encode(SENTENCES)
    base = SentenceTransformer(resolve_model_name(EMBEDDED_MODEL_ALIAS), device="cpu").encode(SENTENCES)
    np.testing.assert_allclose(exported, base, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(exported, axis=1), 1.0, atol=1e-5)

    plan = ExportPlan.from_dict(json.loads((out / "hf_sentcl_card.json").read_text())["plan"])
    assert plan.normalize and plan.base_notes == ()  # a drop-in replacement: nothing to state
    np.testing.assert_allclose(card_embed(plan, out)(SENTENCES), base, atol=1e-5, rtol=0)
    card = (out / "README.md").read_text()
    assert "`Normalize` (`2_Normalize/`)" in card and "unit length" in card


@pytest.fixture
def st_base_with_dense(tiny_bert_dir, tmp_path):
    """The tiny BERT as a sentence-transformers model `Transformer -> Pooling(mean) -> Dense -> Normalize`."""
    base = shutil.copytree(tiny_bert_dir, tmp_path / "st-base")
    (base / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
        {"idx": 3, "name": "3", "path": "3_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]))
    (base / "1_Pooling").mkdir()
    (base / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 32, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True}))
    return base


def test_base_modules_the_export_cannot_keep_are_stated(st_base_with_dense, tmp_path):
    """A cls-pooled encoder trained from a mean-pooled base with Dense + Normalize: Normalize is kept (the export's
    check accounts for it), the Dense and the other pooling are stated in the card."""
    encoder = SentenceEncoder.from_backbone(str(st_base_with_dense), pooling="cls").eval()
    plan = plan_export(encoder)
    assert plan.normalize and list(plan.module_dirs) == ["Transformer", "Pooling", "Normalize"]
    assert len(plan.base_notes) == 2
    assert "`mean`" in plan.base_notes[0] and "`Dense`" in plan.base_notes[1]

    out = tmp_path / "out"
    _plan, differences = export_with_card(encoder, out, {})  # verify=True: the loaders against encode(normalize=True)
    assert max(differences.values()) <= 1e-5
    assert module_classes(out) == ["Transformer", "Pooling", "Normalize"]
    exported = SentenceTransformer(str(out), device="cpu").encode(SENTENCES)
    np.testing.assert_allclose(exported, encoder.encode(SENTENCES, normalize=True), atol=1e-5, rtol=0)
    card = (out / "README.md").read_text()
    assert all(note in card for note in plan.base_notes)


def test_plain_base_gets_no_normalize_and_old_plans_load(tiny_bert_dir):
    """A base without sentence-transformers modules (no modules.json) exports as before; a plan stored by an export
    made before `normalize` existed reads back as what it wrote (no Normalize)."""
    plan = plan_export(SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean").eval())
    assert not plan.normalize and plan.base_notes == () and "Normalize" not in plan.module_dirs
    old = {"pooling": "mean", "source_layers": 2, "kept_layers": 2, "head": "none", "hidden_size": 32,
           "max_seq_length": 64, "token_pooling": "mean", "layer_weights": None}
    assert ExportPlan.from_dict(old) == ExportPlan("mean", 2, 2, "none", 32, 64)
    with pytest.raises(KeyError, match="no 'hidden_size'"):
        ExportPlan.from_dict({k: v for k, v in old.items() if k != "hidden_size"})
