"""Transfer tasks: the SentEval-format readers on hand-made files, the logistic-regression probe (perfect on a
separable set, chance on shuffled labels), the evaluator's single encode pass, and `evaluate --tasks transfer`."""

import json

import numpy as np
import pytest
from helpers import TREC_CLASSES, FakeEncoder, write_full_senteval, write_transfer_tasks
from joblib import parallel_config
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import f1_score

from hf_sentcl.cli.evaluate import main as evaluate_main
from hf_sentcl.evaluation import transfer
from hf_sentcl.evaluation.transfer import (
    TRANSFER_TASKS,
    TransferEvaluator,
    check_transfer_files,
    dev_selected_probe,
    fit_probe,
    kfold_selected_probe,
    load_transfer_task,
    nested_cv_probe,
    pair_features,
    read_binary_task,
    read_mrpc,
    read_sst_binary,
    read_trec,
    transfer_summary,
)


def test_truncated_transfer_file_refused(tmp_path):
    """A transfer file that lost rows (no sizes.json: SentEval's sizes): file, expected and actual count named."""
    (tmp_path / "TREC").mkdir()
    for name in ("train_5500.label", "TREC_10.label"):
        (tmp_path / "TREC" / name).write_text("NUM:dist How far is it ?\n")
    with pytest.raises(ValueError, match=r"train_5500\.label: 1 questions, expected 5452"):
        transfer.load_transfer_task(tmp_path, "TREC")


@pytest.fixture(scope="module")
def transfer_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("senteval-transfer")
    write_full_senteval(root)
    return write_transfer_tasks(root)


# ------------------------------------------------------------------------------------------------ readers
def test_binary_reader_latin1_whitespace_empty_lines_and_senteval_order(tmp_path):
    """Lines are decoded as latin-1, whitespace is collapsed, empty lines stay (as in SentEval), positive lines get
    label 1, and samples are ordered by (token count, label) like SentEval's sort before its folds."""
    (tmp_path / "p").write_bytes(b"a caf\xe9  with  friends \n\ngood\n")
    (tmp_path / "n").write_bytes(b"bad one\nok\n")
    data = read_binary_task(tmp_path / "p", tmp_path / "n")
    assert data.sentences == ["", "ok", "good", "bad one", "a caf\u00e9 with friends"]
    assert data.labels.tolist() == [1, 0, 1, 0, 1]


def test_sst_reader(tmp_path):
    """`sentence<TAB>label` with SentEval's trailing space before the tab; a bad label names file and line."""
    path = tmp_path / "sentiment-dev"
    path.write_text("it 's a charming journey . \t1\nunflinchingly bleak \t0\n", encoding="utf-8")
    data = read_sst_binary(path)
    assert data.sentences == ["unflinchingly bleak", "it 's a charming journey ."]
    assert data.labels.tolist() == [0, 1]
    path.write_text("fine \t1\nbroken line\n", encoding="utf-8")
    with pytest.raises(ValueError, match="sentiment-dev:2"):
        read_sst_binary(path)


def test_trec_reader(tmp_path):
    """`COARSE:fine question` (latin-1): the label is the coarse class's index, the fine label is dropped."""
    path = tmp_path / "TREC_10.label"
    path.write_bytes(b"NUM:dist How far is it from Denver to Aspen ?\nHUM:desc Who was G\xe1lileo ?\n")
    data = read_trec(path)
    assert data.sentences == ["Who was G\u00e1lileo ?", "How far is it from Denver to Aspen ?"]
    assert data.labels.tolist() == [TREC_CLASSES.index("HUM"), TREC_CLASSES.index("NUM")]
    path.write_bytes(b"NUM:dist How far ?\nXYZ:other What ?\n")
    with pytest.raises(ValueError, match=r"TREC_10.label:2.*XYZ"):
        read_trec(path)


def test_mrpc_reader(tmp_path):
    """Byte-order mark and header skipped; label from Quality, sentences from columns 4 and 5; pairs ordered by
    the token counts of both sentences, then label."""
    path = tmp_path / "msr_paraphrase_train.txt"
    path.write_text(
        "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
        "1\t702876\t702977\tAmrozi accused his brother .\tReferring to him , Amrozi accused his brother .\n"
        "0\t2108705\t2108831\tYucaipa owned it .\tYucaipa bought it .\n",
        encoding="utf-8",
    )
    data = read_mrpc(path)
    assert data.sentences1 == ["Yucaipa owned it .", "Amrozi accused his brother ."]
    assert data.sentences2 == ["Yucaipa bought it .", "Referring to him , Amrozi accused his brother ."]
    assert data.labels.tolist() == [0, 1]


def test_missing_files_are_listed(tmp_path):
    """check_transfer_files names every missing file; unknown task names are rejected."""
    (tmp_path / "MR").mkdir()
    (tmp_path / "MR" / "rt-polarity.pos").write_text("good\n")
    with pytest.raises(FileNotFoundError, match=r"rt-polarity\.neg.*custrev\.pos"):
        check_transfer_files(tmp_path, ("MR", "CR"))
    with pytest.raises(ValueError, match="SST5"):
        check_transfer_files(tmp_path, ("SST5",))
    with pytest.raises(FileNotFoundError, match="rt-polarity.neg"):
        load_transfer_task(tmp_path, "MR")


@pytest.mark.slow
def test_real_senteval_sizes(real_data_dir):
    """On the real data the sizes and class counts are SentEval's (CR and MPQA keep their empty lines)."""
    sizes = {t: {s: len(d) for s, d in load_transfer_task(real_data_dir, t).items()} for t in TRANSFER_TASKS}
    assert sizes == {"MR": {"all": 10662}, "CR": {"all": 3775}, "SUBJ": {"all": 10000}, "MPQA": {"all": 10606},
                     "SST2": {"train": 67349, "dev": 872, "test": 1821}, "TREC": {"train": 5452, "test": 500},
                     "MRPC": {"train": 4076, "test": 1725}}


# ------------------------------------------------------------------------------------------------ the probe
def separable(n_per_class=30, dim=6, seed=0):
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.normal(-3, 1, (n_per_class, dim)), rng.normal(3, 1, (n_per_class, dim))])
    return x.astype(np.float32), np.repeat([0, 1], n_per_class)


@pytest.mark.slow
def test_probe_is_perfect_on_a_separable_set():
    """Two far-apart clusters: every protocol reaches 100% test accuracy."""
    x, y = separable()
    assert nested_cv_probe(x, y, kfold=5).acc == 100.0
    xt, yt = separable(seed=1)
    assert kfold_selected_probe(x, y, xt, yt, kfold=5).acc == 100.0
    xd, yd = separable(seed=2)
    result = dev_selected_probe(x, y, xd, yd, xt, yt)
    assert result.acc == 100.0 and result.devacc == 100.0


@pytest.mark.slow
def test_probe_is_at_chance_on_shuffled_labels():
    """The same features with randomly permuted labels carry no signal: accuracy near 50%."""
    x, y = separable(n_per_class=150, seed=3)
    shuffled = np.random.default_rng(4).permutation(y)
    result = nested_cv_probe(x, shuffled, kfold=3)
    assert 40.0 <= result.acc <= 60.0
    assert nested_cv_probe(x, y, kfold=3).acc == 100.0  # the unshuffled labels are learnable


@pytest.mark.slow
def test_probe_picks_c_on_inner_folds_and_is_deterministic():
    """A C from SentEval's grid per outer fold; the same call twice gives the same result, n_jobs changes nothing."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(80, 5)).astype(np.float32)
    y = (x[:, 0] + 0.8 * rng.normal(size=80) > 0).astype(int)
    first = nested_cv_probe(x, y, kfold=4)
    assert len(first.c) == 4 and set(first.c) <= {0.25, 0.5, 1.0, 2.0, 4.0, 8.0}
    assert nested_cv_probe(x, y, kfold=4) == first
    with parallel_config(backend="threading"):  # no process start-up in a unit test; same code path otherwise
        assert nested_cv_probe(x, y, kfold=4, n_jobs=2) == first


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_unconverged_lbfgs_is_refit_with_newton(monkeypatch):
    """A fit that L-BFGS leaves unconverged (here it may take 2 iterations) is redone with Newton-Cholesky, so the
    probe is still the optimum: equal to a tightly converged reference fit (3 classes: multinomial)."""
    rng = np.random.default_rng(6)
    x = (rng.normal(size=(90, 4)) * [1.0, 10.0, 100.0, 0.1]).astype(np.float64)
    y = np.argmax(x[:, :3] / [1.0, 10.0, 100.0] + rng.normal(scale=0.5, size=(90, 3)), axis=1)
    reference = LogisticRegression(C=2.0, tol=1e-12, max_iter=100_000).fit(x, y)
    stopped_early = LogisticRegression(C=2.0, max_iter=2).fit(x, y)
    assert np.abs(stopped_early.coef_ - reference.coef_).max() > 0.1  # what would be kept without the refit
    monkeypatch.setattr(transfer, "LBFGS_MAX_ITER", 2)
    probe = fit_probe(x, y, 2.0)
    assert probe.solver == "newton-cholesky"
    np.testing.assert_allclose(probe.coef_, reference.coef_, atol=1e-3)


def test_too_few_samples_per_class_for_the_folds():
    """Stratified k-fold with fewer samples than folds in a class is refused with the class sizes named."""
    x, y = separable(n_per_class=3)
    with pytest.raises(ValueError, match=r"\[3, 3\]"):
        nested_cv_probe(x, y, kfold=5)


def test_pair_features():
    """[u, v, |u - v|, u * v], computed by hand."""
    u, v = np.array([[1.0, -2.0]]), np.array([[3.0, 4.0]])
    np.testing.assert_array_equal(pair_features(u, v), [[1, -2, 3, 4, 2, 6, 3, -8]])


# ------------------------------------------------------------------------------------------------ the evaluator
@pytest.mark.slow
def test_evaluator_one_encode_pass_and_results(transfer_dir):
    """One encode call over the distinct sentences of all tasks; accuracy per task, MRPC F1 equal to sklearn's F1
    of the probe chosen the same way on the same features, and the summary row's Avg over the 7 accuracies."""
    evaluator = TransferEvaluator(transfer_dir, kfold=3)
    sentences = evaluator.sentences()
    rng = np.random.default_rng(0)
    encoder = FakeEncoder({s: rng.normal(size=8).astype(np.float32) for s in sentences})
    details = evaluator(encoder, batch_size=5, bf16=True)
    assert len(encoder.calls) == 1 and encoder.calls[0]["batch_size"] == 5 and encoder.calls[0]["bf16"] is True
    assert sorted(encoder.calls[0]["sentences"]) == sorted(set(sentences))
    assert set(details) == set(TRANSFER_TASKS)
    assert details["MR"]["ntrain"] == 24 and details["SST2"]["ndev"] == 6 and details["TREC"]["ntest"] == 12

    mrpc = evaluator.data["MRPC"]
    vec = lambda ss: np.stack([encoder.vectors[s] for s in ss])  # noqa: E731
    x_train = pair_features(vec(mrpc["train"].sentences1), vec(mrpc["train"].sentences2))
    x_test = pair_features(vec(mrpc["test"].sentences1), vec(mrpc["test"].sentences2))
    probe = kfold_selected_probe(x_train, mrpc["train"].labels, x_test, mrpc["test"].labels, kfold=3)
    assert details["MRPC"]["acc"] == pytest.approx(probe.acc)
    assert details["MRPC"]["f1"] == pytest.approx(100 * f1_score(mrpc["test"].labels, probe.predictions))

    row = transfer_summary(details)
    assert row["MRPC_F1"] == details["MRPC"]["f1"]
    assert row["Avg"] == pytest.approx(np.mean([details[t]["acc"] for t in TRANSFER_TASKS]))


def test_evaluator_rejects_unknown_tasks_and_bad_kfold(transfer_dir):
    with pytest.raises(ValueError, match="STS12"):
        TransferEvaluator(transfer_dir, tasks=("MR", "STS12"))
    with pytest.raises(ValueError, match="kfold"):
        TransferEvaluator(transfer_dir, kfold=1)


# ------------------------------------------------------------------------------------------------ the CLI
@pytest.mark.slow
def test_cli_transfer_and_sts_transfer(tmp_path, tiny_bert_dir, transfer_dir):
    """`--tasks transfer` writes the transfer row and per-task details to the JSON and a table to the .md;
    `--tasks sts,transfer` adds the STS scores (top-level keys, as for STS alone) to the same outputs."""
    output = tmp_path / "transfer.json"
    common = ["--model", str(tiny_bert_dir), "--data-dir", str(transfer_dir), "--device", "cpu", "--kfold", "3",
              "--pooling", "mean"]
    assert evaluate_main([*common, "--tasks", "transfer", "--output", str(output)]) == 0
    results = json.loads(output.read_text())
    assert set(results["transfer"]) == {*TRANSFER_TASKS, "MRPC_F1", "Avg"}
    assert all(0 <= v <= 100 for v in results["transfer"].values())
    assert results["transfer_details"]["MRPC"]["ntest"] == 8 and results["kfold"] == 3
    assert "STSBenchmark" not in results
    table = output.with_suffix(".md").read_text()
    assert "| MR | CR | SUBJ | MPQA | SST-2 | TREC | MRPC | MRPC F1 | Avg |" in table

    both = tmp_path / "both.json"
    assert evaluate_main([*common, "--tasks", "sts,transfer", "--transfer-tasks", "MRPC",
                          "--output", str(both)]) == 0
    combined = json.loads(both.read_text())
    assert combined["transfer"]["MRPC"] == results["transfer"]["MRPC"]  # seeded and deterministic
    assert {"STS12", "STSBenchmark", "SICKRelatedness", "Avg"} <= set(combined)
    text = both.with_suffix(".md").read_text()
    assert "| STS-B |" in text and "| MRPC | MRPC F1 | Avg |" in text


def test_cli_missing_transfer_data(tmp_path, tiny_bert_dir, senteval_dir, capsys):
    """A data directory without the transfer tasks: exit 2 naming a missing file, before loading the model."""
    code = evaluate_main(["--model", str(tiny_bert_dir), "--data-dir", str(senteval_dir), "--tasks", "transfer"])
    assert code == 2 and "rt-polarity.pos" in capsys.readouterr().err


def test_layout_builder_is_senteval_shaped(transfer_dir):
    """The tiny layout used above reads back with the expected sizes (guards the builder itself)."""
    trec = load_transfer_task(transfer_dir, "TREC")["train"]
    assert len(trec) == 6 * 12 and np.bincount(trec.labels).tolist() == [12] * 6
