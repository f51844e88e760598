"""Export round trip: SentenceEncoder.encode, plain AutoModel + the model card's pooling code, and
SentenceTransformer(OUT).encode agree, on tiny BERT and RoBERTa, for every exportable pooling/head setting."""

import json
import shutil

import numpy as np
import pytest
import torch
from helpers import random_sentences
from safetensors.torch import load_file
from sentence_transformers import SentenceTransformer
from transformers import AutoConfig, AutoModel

from hf_sentcl import SentenceEncoder
from hf_sentcl.cli.export import main
from hf_sentcl.export.plan import ExportError, plan_export
from hf_sentcl.export.snippets import transformers_snippet
from hf_sentcl.export.verify import verify_export
from hf_sentcl.export.writer import export_encoder

SENTENCES = random_sentences(24, seed=3, min_words=1, max_words=14)
ATOL = 1e-5


def make_encoder(backbone_dir, seed: int = 0, **settings) -> SentenceEncoder:
    """A tiny encoder whose MLP head (if any) is far from the identity, so a dropped head would show."""
    encoder = SentenceEncoder.from_backbone(str(backbone_dir), **settings)
    if encoder.head is not None:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            encoder.head.dense.weight.copy_(torch.randn(encoder.head.dense.weight.shape, generator=generator))
            encoder.head.dense.bias.copy_(torch.randn(encoder.head.dense.bias.shape, generator=generator))
    return encoder.eval()


def card_embed(plan, path):
    """The `embed` function of the model card's plain-transformers snippet, run against `path`."""
    namespace: dict = {}
    exec(compile(transformers_snippet(plan, str(path)), "<model card snippet>", "exec"), namespace)
    return lambda sentences: namespace["embed"](sentences).numpy()


def assert_three_ways_agree(encoder, path, plan):
    reference = encoder.encode(SENTENCES, batch_size=7)
    via_automodel = card_embed(plan, path)(SENTENCES)
    via_st = SentenceTransformer(str(path), device="cpu").encode(SENTENCES, batch_size=5)
    np.testing.assert_allclose(via_automodel, reference, atol=ATOL, rtol=0)
    np.testing.assert_allclose(via_st, reference, atol=ATOL, rtol=0)
    return reference


ROUND_TRIP = {
    "cls": dict(pooling="cls", head="mlp", head_at_inference=False),  # SimCSE unsup: MLP is training-only
    "cls_mlp": dict(pooling="cls", head="mlp", head_at_inference=True),  # SimCSE sup: [CLS] + MLP at test
    "mean": dict(pooling="mean", head="none"),
}


@pytest.mark.parametrize("setting", list(ROUND_TRIP))
def test_round_trip_bert_and_roberta(tiny_backbone_dir, tmp_path, setting):
    encoder = make_encoder(tiny_backbone_dir, **ROUND_TRIP[setting])
    out = tmp_path / "export"
    plan = export_encoder(encoder, out, verify=False)
    assert_three_ways_agree(encoder, out, plan)

    config = json.loads((out / "config.json").read_text())
    backbone_class = type(encoder.backbone).__name__
    assert config["architectures"] == [backbone_class] and config["model_type"] in ("bert", "roberta")
    assert type(AutoModel.from_pretrained(out)).__name__ == backbone_class  # no trust_remote_code involved
    modules = json.loads((out / "modules.json").read_text())
    pooling = json.loads((out / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode"] == ("mean" if setting == "mean" else "cls")  # written by sentence-transformers
    assert [m["type"] for m in modules][:2] == [
        "sentence_transformers.base.modules.transformer.Transformer",
        "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
    ]
    if setting == "cls_mlp":
        # folded into the pooler for AutoModel users, and a Dense(Tanh) module for sentence-transformers
        assert plan.head == "pooler" and [m["path"] for m in modules] == ["", "1_Pooling", "2_Dense"]
        pooler = AutoModel.from_pretrained(out).pooler.dense
        assert torch.equal(pooler.weight, encoder.head.dense.weight)
        dense = load_file(out / "2_Dense" / "model.safetensors")
        assert torch.equal(dense["linear.weight"], encoder.head.dense.weight)
        assert json.loads((out / "2_Dense" / "config.json").read_text())["activation_function"].endswith("Tanh")
    else:
        # training-only head left out: no Dense module, the backbone's own pooler untouched
        assert plan.head == "none" and [m["path"] for m in modules] == ["", "1_Pooling"]
        original = AutoModel.from_pretrained(str(tiny_backbone_dir)).pooler.dense.weight
        assert torch.equal(AutoModel.from_pretrained(out).pooler.dense.weight, original)


def test_head_matters_in_cls_mlp_export(tiny_bert_dir, tmp_path):
    """The folded head is really applied: the exported vectors differ from the raw [CLS] vectors."""
    encoder = make_encoder(tiny_bert_dir, pooling="cls", head="mlp", head_at_inference=True)
    plan = export_encoder(encoder, tmp_path / "out", verify=False)
    with_head = card_embed(plan, tmp_path / "out")(SENTENCES)
    encoder.config.head_at_inference = False
    assert not np.allclose(with_head, encoder.encode(SENTENCES), atol=1e-3)


EXTRA = {
    "mean_layer1": (dict(pooling="mean", pooling_layer=1), 1, "none"),
    "cls_layer0_embeddings": (dict(pooling="cls", pooling_layer=0), 0, "none"),
    "max": (dict(pooling="max"), 2, "none"),
    "last2_avg": (dict(pooling="cls", inference_pooling="last2_avg"), 2, "none"),
    "first_last_avg_mlp": (dict(pooling="first_last_avg", head="mlp", head_at_inference=True), 2, "dense"),
    "mean_mlp": (dict(pooling="mean", head="mlp", head_at_inference=True), 2, "dense"),
    "cls_mlp_layer1": (dict(pooling="cls", pooling_layer=1, head="mlp", head_at_inference=True), 1, "pooler"),
}


@pytest.mark.parametrize("setting", list(EXTRA))
def test_round_trip_other_poolings(tiny_bert_dir, tmp_path, setting):
    """pooling_layer truncates the backbone; layer averages use WeightedLayerPooling; other heads a Dense module."""
    settings, kept_layers, head = EXTRA[setting]
    encoder = make_encoder(tiny_bert_dir, **settings)
    plan = export_encoder(encoder, tmp_path / "out", verify=False)
    assert (plan.kept_layers, plan.head) == (kept_layers, head)
    assert AutoConfig.from_pretrained(tmp_path / "out").num_hidden_layers == kept_layers
    assert_three_ways_agree(encoder, tmp_path / "out", plan)


@pytest.mark.slow
def test_export_verifies_itself_and_drops_trainer_modules(tiny_bert_dir, tmp_path):
    """Modules a trainer attaches to the encoder (SG's projection head) are not exported; verify=True passes."""
    encoder = make_encoder(tiny_bert_dir, pooling="mean", head="mlp", head_at_inference=True)
    encoder.add_module("sg_projection", torch.nn.Linear(32, 64))
    export_encoder(encoder, tmp_path / "ok")  # verify=True by default
    stored = load_file(tmp_path / "ok" / "model.safetensors")
    assert not any("sg_projection" in key or key.startswith("head.") for key in stored)
    bad = make_encoder(tiny_bert_dir, pooling="mean")
    plan = export_encoder(bad, tmp_path / "bad", verify=False)
    with torch.no_grad():
        bad.backbone.encoder.layer[-1].output.dense.weight.mul_(-1)  # the folder no longer matches the encoder
    with pytest.raises(ExportError, match="does not reproduce"):
        verify_export(bad, tmp_path / "bad", plan)


def test_verification_ignores_mixed_precision_wrapper(tiny_bert_dir, tmp_path):
    """After bf16 training, accelerate leaves an autocast wrapper on the model's forward; the export's self-check
    compares with a clean fp32 copy, so it neither fails nor hides a real mismatch."""
    from types import MethodType

    encoder = make_encoder(tiny_bert_dir, pooling="cls", head="mlp", head_at_inference=True)
    clean = encoder.encode(SENTENCES)
    encoder._original_forward = encoder.forward
    encoder.forward = MethodType(torch.autocast("cpu", dtype=torch.bfloat16)(type(encoder).forward), encoder)
    assert np.abs(encoder.encode(SENTENCES) - clean).max() > 1e-4  # the wrapper really changes encode
    plan = export_encoder(encoder, tmp_path / "out")  # verify=True
    np.testing.assert_allclose(card_embed(plan, tmp_path / "out")(SENTENCES), clean, atol=ATOL, rtol=0)


def test_unexportable_head_is_refused(tiny_bert_dir, tmp_path):
    encoder = make_encoder(tiny_bert_dir, pooling="cls", head="mlp", head_at_inference=True)
    encoder.head = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU())
    with pytest.raises(ExportError, match="head_at_inference"):
        plan_export(encoder)


def test_export_folder_safety(tiny_bert_dir, tmp_path):
    encoder = make_encoder(tiny_bert_dir, pooling="cls", head="mlp", head_at_inference=True)
    out = tmp_path / "out"
    export_encoder(encoder, out, verify=False)
    with pytest.raises(ExportError, match="--overwrite"):
        export_encoder(encoder, out, verify=False)
    encoder.config.head_at_inference = False
    export_encoder(encoder, out, overwrite=True, verify=False)
    assert not (out / "2_Dense").exists()  # no stale module from the earlier export
    other = tmp_path / "not_an_export"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(ExportError, match="Refusing"):
        export_encoder(encoder, other, overwrite=True, verify=False)
    assert (other / "notes.txt").read_text() == "keep me"


@pytest.mark.slow
def test_cli_exports_checkpoint_with_card(tiny_bert_dir, tmp_path, capsys):
    encoder = make_encoder(tiny_bert_dir, pooling="cls", head="mlp", head_at_inference=True)
    checkpoint = tmp_path / "run"
    encoder.save_pretrained(checkpoint)
    (checkpoint / "results.json").write_text(json.dumps({"method": "simcse_sup", "sts_mode": "all"}))
    assert main([str(checkpoint), str(tmp_path / "out"), "--repo-id", "me/tiny"]) == 2  # a results file without scores
    assert "holds no STS or transfer scores" in capsys.readouterr().err and not (tmp_path / "out").exists()
    (checkpoint / "results.json").write_text(json.dumps({"method": "simcse_sup", "transfer": {"after": {"MR": 80.0}}}))
    assert main([str(checkpoint), str(tmp_path / "out"), "--repo-id", "me/tiny"]) == 0
    card = (tmp_path / "out" / "README.md").read_text()
    assert "simcse_sup" in card and 'model_id = "me/tiny"' in card
    assert np.allclose(
        SentenceTransformer(str(tmp_path / "out"), device="cpu").encode(SENTENCES), encoder.encode(SENTENCES), atol=ATOL
    )


def test_cli_plain_backbone_needs_pooling(tiny_bert_dir, tmp_path, capsys):
    """An untouched backbone exports with --pooling (and is refused, before anything is written, without it)."""
    assert main([str(tiny_bert_dir), str(tmp_path / "out")]) == 2
    assert "--pooling" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert main([str(tiny_bert_dir), str(tmp_path / "out"), "--pooling", "mean"]) == 0
    reference = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean").eval().encode(SENTENCES)
    exported = SentenceTransformer(str(tmp_path / "out"), device="cpu").encode(SENTENCES)
    np.testing.assert_allclose(exported, reference, atol=ATOL, rtol=0)


def test_cli_checks_export_on_probe_file(tiny_bert_dir, tmp_path, capsys):
    """--probe-file checks both loaders on the file's distinct sentences and prints the differences."""
    encoder = make_encoder(tiny_bert_dir, pooling="mean")
    encoder.save_pretrained(tmp_path / "run")
    probes = tmp_path / "probes.txt"
    probes.write_text("\n".join([*SENTENCES, SENTENCES[0], ""]) + "\n")
    assert main([str(tmp_path / "run"), str(tmp_path / "out"), "--probe-file", str(probes), "--probe-count", "3"]) == 0
    out = capsys.readouterr().out
    assert "Checked on 3 sentences" in out and "transformers" in out and "sentence-transformers" in out


def test_cli_missing_probe_file(tiny_bert_dir, tmp_path, capsys):
    make_encoder(tiny_bert_dir, pooling="mean").save_pretrained(tmp_path / "run")
    assert main([str(tmp_path / "run"), str(tmp_path / "out"), "--probe-file", str(tmp_path / "nope.txt")]) == 2
    assert "nope.txt" in capsys.readouterr().err


def snapshot(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_failed_overwrite_leaves_the_old_export(tiny_bert_dir, tmp_path):
    """--overwrite builds beside OUT and swaps only after the checks: a failing check changes nothing."""
    encoder = make_encoder(tiny_bert_dir, pooling="mean")
    out = tmp_path / "out"
    export_encoder(encoder, out)
    before = snapshot(out)
    other = make_encoder(tiny_bert_dir, pooling="max")
    with pytest.raises(ExportError, match="does not reproduce"):
        export_encoder(other, out, overwrite=True, tolerance=-1.0)  # no difference is <= -1: the check fails
    assert snapshot(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing left over
    export_encoder(other, out, overwrite=True)
    assert json.loads((out / "1_Pooling" / "config.json").read_text())["pooling_mode"] == "max"


def test_non_finite_or_collapsed_models_are_not_exported(tiny_bert_dir, tmp_path):
    encoder = make_encoder(tiny_bert_dir, pooling="mean")
    with torch.no_grad():
        encoder.backbone.encoder.layer[0].output.dense.weight[0, 0] = float("nan")
    with pytest.raises(ExportError, match="non-finite weights"):
        export_encoder(encoder, tmp_path / "nan")
    collapsed = make_encoder(tiny_bert_dir, pooling="mean")
    with torch.no_grad():  # every token of the last layer becomes the LayerNorm bias: one vector for all sentences
        collapsed.backbone.encoder.layer[-1].output.LayerNorm.weight.zero_()
    with pytest.raises(ExportError, match="collapsed"):
        export_encoder(collapsed, tmp_path / "collapsed")
    assert sorted(tmp_path.iterdir()) == []  # no export, no card, no partial folder


def test_verification_rejects_non_finite_export(tiny_bert_dir, tmp_path):
    """A NaN embedding is not "within tolerance" (NaN > tolerance is False): verification names it."""
    from safetensors.torch import save_file

    encoder = make_encoder(tiny_bert_dir, pooling="mean")
    plan = export_encoder(encoder, tmp_path / "out", verify=False)
    weights = load_file(tmp_path / "out" / "model.safetensors")
    name = next(k for k in weights if k.endswith("output.dense.weight"))
    weights[name] = torch.full_like(weights[name], float("nan"))
    save_file(weights, tmp_path / "out" / "model.safetensors")
    with pytest.raises(ExportError, match="non-finite embeddings"):
        verify_export(encoder, tmp_path / "out", plan)


@pytest.mark.slow
def test_cli_from_evaluate_output_with_mteb_files(tiny_bert_dir, real_data_dir, tmp_path, capsys):
    """`evaluate --output` JSON -> card tables + model-index (MTEB protocol, computed here on SentEval's own STS
    data) + MTEB files."""
    import mteb
    from huggingface_hub import ModelCard
    from mteb.models import ModelMeta
    from mteb.results import TaskResult

    from hf_sentcl.evaluation.sts import STS_TASKS, STSEvaluator

    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="max").eval()
    sts = STSEvaluator(real_data_dir)(encoder)
    evaluated = {"model": str(tiny_bert_dir), "pooling": "max", "pooling_layer": -1, "tasks": ["sts"],
                 "sts_mode": "all", "sick_split": "test", "precision": "fp32", **sts}
    res = tmp_path / "res.json"
    res.write_text(json.dumps(evaluated))
    out, mt = tmp_path / "out", tmp_path / "mt"
    common = ["--results", str(res), "--mteb-results", str(mt), "--repo-id", "org/name",
              "--data-dir", str(real_data_dir)]
    assert main([str(tiny_bert_dir), str(out), "--pooling", "mean", *common]) == 2  # not what was evaluated
    assert "pooling 'max'" in capsys.readouterr().err and not out.exists()
    other = shutil.copytree(tiny_bert_dir, tmp_path / "other-model")
    assert main([str(other), str(out), *common]) == 2
    assert "was measured on" in capsys.readouterr().err
    assert main([str(tiny_bert_dir), str(out), *common]) == 0  # the pooling comes from the results file

    card = ModelCard.load(out / "README.md")
    # MTEB's protocol, one task per encode pass as the export scores them: a random tiny model's cosines are so
    # close that the other batches of one pass over all tasks move a Spearman by 0.01
    expected = {task: STSEvaluator(real_data_dir, tasks=(task,), mode="all", sick_split="all")(encoder)[task]
                for task in STS_TASKS}
    assert [r.dataset_name for r in card.data.eval_results] == [
        "MTEB STS12", "MTEB STS13", "MTEB STS14", "MTEB STS15", "MTEB STS16", "MTEB STSBenchmark", "MTEB SICK-R"]
    for result, task in zip(card.data.eval_results, STS_TASKS, strict=True):
        assert result.metric_type == "cos_sim_spearman" and result.dataset_type.startswith("mteb/")
        assert result.metric_value == pytest.approx(expected[task], abs=1e-4)
    assert f"| this model | {sts['STS12']:.2f} |" in card.text and 'SentenceTransformer("org/name")' in card.text
    folder = mt / "results" / "org__name" / "no_revision_available"
    files = sorted(folder.glob("*.json"))
    assert len(files) == 8
    for path in files:
        if path.name == "model_meta.json":
            assert ModelMeta.model_validate_json_resolved(path.read_text()).name == "org/name"
        else:
            result = TaskResult.from_disk(path)
            assert result.mteb_version == mteb.__version__ and result.evaluation_time > 0
    sick = TaskResult.from_disk(folder / "SICK-R.json")
    assert sick.get_score() * 100 == pytest.approx(expected["SICKRelatedness"], abs=1e-3)


@pytest.mark.slow
def test_cli_claims_no_mteb_scores_for_other_sts_data(tiny_bert_dir, senteval_dir, tmp_path, capsys):
    """STS data that declares its own sizes (a sample, a test layout) is not MTEB's: `--mteb-results` is refused
    before the model loads, naming the file that says so; without it the card keeps its STS table but gets no
    model-index."""
    from huggingface_hub import ModelCard

    from hf_sentcl.evaluation.sts import STSEvaluator

    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="max").eval()
    res = tmp_path / "res.json"
    res.write_text(json.dumps({"model": str(tiny_bert_dir), "pooling": "max", "pooling_layer": -1, "tasks": ["sts"],
                               "sts_mode": "all", "sick_split": "test", "precision": "fp32",
                               **STSEvaluator(senteval_dir)(encoder)}))
    out = tmp_path / "out"
    common = [str(tiny_bert_dir), str(out), "--results", str(res), "--repo-id", "org/name", "--data-dir",
              str(senteval_dir)]
    assert main([*common, "--mteb-results", str(tmp_path / "mt")]) == 2
    error = capsys.readouterr().err
    assert "--mteb-results: MTEB-protocol scores are computed on SentEval's own STS data only" in error
    assert f"{senteval_dir}/STS/STS12-en-test/sizes.json declares sizes other than SentEval's" in error
    assert not out.exists() and not (tmp_path / "mt").exists()
    broken = shutil.copytree(senteval_dir, tmp_path / "broken")
    (broken / "SICK" / "SICK_train.txt").unlink()  # a file the protocol reads is missing: an error, as ever
    assert main([*common[:-1], str(broken)]) == 2
    assert "SICK_train.txt" in capsys.readouterr().err and not out.exists()
    assert main(common) == 0
    assert "No model-index in the card" in capsys.readouterr().err
    card = ModelCard.load(out / "README.md")
    assert card.data.eval_results is None and "model-index" not in card.content
    assert "| this model |" in card.text


def test_cli_pools_the_hidden_state_the_evaluate_output_was_measured_on(tiny_bert_dir, senteval_dir, tmp_path,
                                                                         capsys):
    """`evaluate --pooling-layer 1 --output` then `export --results`: the export pools hidden state 1, as the card's
    scores were measured (it pooled the last layer under those scores); another --pooling-layer is refused before
    anything is written."""
    from sentence_transformers import SentenceTransformer

    from hf_sentcl.cli.evaluate import main as evaluate_main

    res = tmp_path / "res.json"
    assert evaluate_main(["--model", str(tiny_bert_dir), "--pooling", "mean", "--pooling-layer", "1", "--data-dir",
                          str(senteval_dir), "--output", str(res), "--device", "cpu"]) == 0
    out = tmp_path / "out"
    common = [str(tiny_bert_dir), str(out), "--results", str(res), "--data-dir", str(senteval_dir)]
    assert main([*common, "--pooling-layer", "-1"]) == 2
    assert "measured pooling hidden state 1 but the export pools hidden state -1" in capsys.readouterr().err
    assert not out.exists()
    assert main([*common, "--pooling-layer", str(1 - 3)]) == 0  # -2 of the tiny BERT's 3 hidden states is 1
    assert main([*common, "--overwrite"]) == 0
    layer_1 = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean", pooling_layer=1).eval()
    probes = ["a first probe sentence", "and another one here"]
    exported = SentenceTransformer(str(out), device="cpu").encode(probes)
    assert abs(exported - layer_1.encode(probes)).max() <= 1e-5
