"""STS evaluator on a hand-made SentEval layout with a fake encoder, against scipy's Spearman computed by hand."""

import numpy as np
import pytest
from helpers import FakeEncoder, write_sick, write_sts_year, write_stsb
from scipy.stats import spearmanr

from hf_sentcl.evaluation.sts import STS_TASKS, STSEvaluator, load_sts_task


def cosine(u, v):
    return float(np.dot(u, v) / (np.linalg.norm(u) * np.linalg.norm(v)))


def spearman100(gold, predicted):
    return 100 * spearmanr(gold, predicted).statistic


class Layout:
    """A tiny SentEval directory; every sentence gets a random 3-d vector, except those of rows without a gold
    score, which the fake encoder does not know (asking for them raises KeyError)."""

    def __init__(self, root):
        self.root = root
        self.rng = np.random.default_rng(7)
        self.vectors = {}
        self.counter = 0
        self.sts12 = {"MSRpar": self.rows(7, blank={1, 4}), "MSRvid": self.rows(4)}
        self.stsb = {split: self.rows(n) for split, n in (("test", 6), ("dev", 5), ("train", 3))}
        self.sick = {split: self.rows(n) for split, n in (("test", 5), ("dev", 3), ("train", 4))}
        write_sts_year(root, "STS12", self.sts12)
        for split, rows in self.stsb.items():
            write_stsb(root, split, rows)
        for split, rows in self.sick.items():
            write_sick(root, split, rows)

    def rows(self, n, blank=()):
        rows = []
        for i in range(n):
            a, b = f"sentence {self.counter} a", f"sentence {self.counter} b"
            self.counter += 1
            score = None if i in blank else float(self.rng.uniform(0, 5))
            if score is not None:
                self.vectors[a] = self.rng.normal(size=3)
                self.vectors[b] = self.rng.normal(size=3)
            rows.append((a, b, score))
        return rows

    def gold_and_cos(self, rows, digits=3):
        """Gold scores as written to disk (STS files keep 3 decimals, SICK 1) and the cosines of the vectors."""
        kept = [(a, b, s) for a, b, s in rows if s is not None]
        gold = np.array([round(s, digits) for _, _, s in kept])
        cos = np.array([cosine(self.vectors[a], self.vectors[b]) for a, b, _ in kept])
        return gold, cos


@pytest.fixture
def layout(tmp_path):
    return Layout(tmp_path / "senteval")


def test_rows_without_gold_are_dropped(layout):
    """Empty lines in STS.gs.* drop their pair; the other pairs keep their order and scores."""
    data = load_sts_task(layout.root, "STS12")
    assert set(data) == {"MSRpar", "MSRvid"}
    msrpar = data["MSRpar"]
    assert len(msrpar) == 5
    kept = [r for r in layout.sts12["MSRpar"] if r[2] is not None]
    assert msrpar.sentences1 == [a for a, _, _ in kept]
    assert msrpar.sentences2 == [b for _, b, _ in kept]
    np.testing.assert_allclose(msrpar.scores, [round(s, 3) for _, _, s in kept])


def test_stsb_and_sick_readers(layout):
    """STS-B reads column 5 as the score and 6/7 as sentences; SICK skips its header (CRLF lines)."""
    stsb = load_sts_task(layout.root, "STSBenchmark", "dev")["dev"]
    assert stsb.sentences1 == [a for a, _, _ in layout.stsb["dev"]]
    assert stsb.sentences2 == [b for _, b, _ in layout.stsb["dev"]]
    np.testing.assert_allclose(stsb.scores, [round(s, 3) for _, _, s in layout.stsb["dev"]])
    sick = load_sts_task(layout.root, "SICKRelatedness")["test"]
    assert sick.sentences1 == [a for a, _, _ in layout.sick["test"]]
    assert sick.sentences2 == [b for _, b, _ in layout.sick["test"]]  # no trailing '\r'
    np.testing.assert_allclose(sick.scores, [round(s, 1) for _, _, s in layout.sick["test"]])


TASKS = ("STS12", "STSBenchmark", "SICKRelatedness")


def expected_sts12(layout, mode):
    per_subset = [layout.gold_and_cos(rows) for rows in layout.sts12.values()]
    if mode == "all":
        return spearman100(np.concatenate([g for g, _ in per_subset]), np.concatenate([c for _, c in per_subset]))
    scores = [spearman100(g, c) for g, c in per_subset]
    if mode == "mean":
        return sum(scores) / len(scores)
    sizes = [len(g) for g, _ in per_subset]
    return sum(s * n for s, n in zip(scores, sizes)) / sum(sizes)


@pytest.mark.parametrize("mode", ["all", "mean", "wmean"])
def test_evaluator_scores_match_hand_computation(layout, mode):
    """Each task's score is Spearman x 100 of gold vs cosine; STS12 subsets combine as `mode` says; Avg is the
    mean over tasks."""
    evaluator = STSEvaluator(layout.root, tasks=TASKS, mode=mode)
    results = evaluator(FakeEncoder(layout.vectors))
    assert set(results) == set(TASKS) | {"Avg"}
    assert results["STS12"] == pytest.approx(expected_sts12(layout, mode), abs=1e-9)
    assert results["STSBenchmark"] == pytest.approx(spearman100(*layout.gold_and_cos(layout.stsb["test"])), abs=1e-9)
    assert results["SICKRelatedness"] == pytest.approx(
        spearman100(*layout.gold_and_cos(layout.sick["test"], digits=1)), abs=1e-9
    )
    assert results["Avg"] == pytest.approx(np.mean([results[t] for t in TASKS]), abs=1e-9)


def test_modes_really_differ(layout):
    """On this data all / mean / wmean give three different STS12 numbers (so the mode tests are meaningful)."""
    values = {mode: expected_sts12(layout, mode) for mode in ("all", "mean", "wmean")}
    assert len({round(v, 6) for v in values.values()}) == 3


def test_one_encode_call_over_distinct_sentences(layout):
    """The evaluator encodes every distinct sentence once, in one call, passing batch_size and bf16 through."""
    encoder = FakeEncoder(layout.vectors)
    layout.vectors["shared"] = np.ones(3)
    STSEvaluator(layout.root, tasks=TASKS)(encoder, batch_size=7, bf16=True)
    assert len(encoder.calls) == 1
    call = encoder.calls[0]
    assert call["batch_size"] == 7 and call["bf16"] is True
    assert len(call["sentences"]) == len(set(call["sentences"]))
    expected = {s for rows in (*layout.sts12.values(), layout.stsb["test"], layout.sick["test"])
                for a, b, score in rows if score is not None for s in (a, b)}
    assert set(call["sentences"]) == expected


def test_dev_split_and_sick_all(layout):
    """split='dev' reads sts-dev.csv; sick_split='all' pools SICK train + trial + test."""
    dev = STSEvaluator(layout.root, tasks=("STSBenchmark",), split="dev")(FakeEncoder(layout.vectors))
    assert dev["STSBenchmark"] == pytest.approx(spearman100(*layout.gold_and_cos(layout.stsb["dev"])), abs=1e-9)
    pooled = STSEvaluator(layout.root, tasks=("SICKRelatedness",), sick_split="all")
    assert len(pooled.data["SICKRelatedness"]["all"]) == 5 + 3 + 4
    gold, cos = zip(*(layout.gold_and_cos(layout.sick[s], digits=1) for s in ("train", "dev", "test")))
    result = pooled(FakeEncoder(layout.vectors))
    assert result["SICKRelatedness"] == pytest.approx(spearman100(np.concatenate(gold), np.concatenate(cos)), abs=1e-9)


def test_data_dir_from_environment(layout, monkeypatch):
    """Without an explicit directory the evaluator reads $HF_SENTCL_DATA."""
    monkeypatch.setenv("HF_SENTCL_DATA", str(layout.root))
    results = STSEvaluator(tasks=("STSBenchmark",))(FakeEncoder(layout.vectors))
    assert results["STSBenchmark"] == pytest.approx(spearman100(*layout.gold_and_cos(layout.stsb["test"])), abs=1e-9)


def test_missing_data_dir_mentions_env_var(monkeypatch, tmp_path):
    """No directory and no HF_SENTCL_DATA, or a directory that does not exist: FileNotFoundError naming the
    variable."""
    monkeypatch.delenv("HF_SENTCL_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match="HF_SENTCL_DATA"):
        STSEvaluator(tasks=("STSBenchmark",))
    with pytest.raises(FileNotFoundError, match="HF_SENTCL_DATA"):
        STSEvaluator(tmp_path / "nowhere", tasks=("STSBenchmark",))


def test_missing_task_files(layout):
    """A task whose files are absent is a FileNotFoundError naming what is missing."""
    with pytest.raises(FileNotFoundError, match="STS13"):
        STSEvaluator(layout.root, tasks=("STS13",))


def test_gold_and_input_length_mismatch(tmp_path):
    """A gold file with a different number of lines than its input file is an error naming the subset."""
    folder = write_sts_year(tmp_path, "STS12", {"MSRpar": [("a b", "c d", 1.0), ("e f", "g h", 2.0)]})
    (folder / "STS.gs.MSRpar.txt").write_text("1.0\n")
    with pytest.raises(ValueError, match="MSRpar"):
        load_sts_task(tmp_path, "STS12")


def test_unknown_mode_and_task(layout):
    """Unknown averaging modes and task names are rejected up front."""
    with pytest.raises(ValueError, match="'median'"):
        STSEvaluator(layout.root, tasks=TASKS, mode="median")
    with pytest.raises(ValueError, match="STS17"):
        STSEvaluator(layout.root, tasks=("STS17",))


def test_real_senteval_pair_counts(real_data_dir):
    """On the real SentEval data the pair counts are SentEval's (gold-less rows dropped, STS13 without SMT)."""
    counts = {task: sum(len(p) for p in load_sts_task(real_data_dir, task).values()) for task in STS_TASKS}
    assert counts == {"STS12": 3108, "STS13": 1500, "STS14": 3750, "STS15": 3000, "STS16": 1186,
                      "STSBenchmark": 1379, "SICKRelatedness": 4927}
    assert len(load_sts_task(real_data_dir, "STSBenchmark", "dev")["dev"]) == 1500


# ------------------------------------------------------------------------------------------ malformed data
def test_truncated_stsb_test_names_file_and_counts(tmp_path):
    """A copy of STS-B test that lost rows: the error names the file, the expected and the actual pair count."""
    rows = [(f"a {i}", f"b {i}", 1.0 + i % 4) for i in range(8)]
    path = write_stsb(tmp_path, "test", rows)  # declares 8 scored pairs
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:5]))
    with pytest.raises(ValueError, match=r"sts-test\.csv: 5 scored pairs, expected 8"):
        load_sts_task(tmp_path, "STSBenchmark", "test")


def test_known_sizes_apply_without_manifest(tmp_path):
    """Without a sizes.json the SentEval sizes hold: a 3-row STS-B test is refused against its 1,379 pairs."""
    path = write_stsb(tmp_path, "test", [("a", "b", 1.0), ("c", "d", 2.0), ("e", "f", 3.0)])
    (path.parent / "sizes.json").unlink()
    with pytest.raises(ValueError, match="3 scored pairs, expected 1379"):
        load_sts_task(tmp_path, "STSBenchmark", "test")


@pytest.mark.parametrize("bad", ["nan", "inf", "x"])
def test_bad_gold_score_names_line(tmp_path, bad):
    """A NaN, infinite or non-numeric gold score: the error names the file and its line."""
    rows = [(f"a {i}", f"b {i}", 1.0) for i in range(4)]
    path = write_stsb(tmp_path, "dev", rows)
    lines = path.read_text().splitlines(keepends=True)
    lines[2] = lines[2].replace("\t1.000\t", f"\t{bad}\t")
    path.write_text("".join(lines))
    with pytest.raises(ValueError, match=rf"sts-dev\.csv, line 3: gold score '{bad}' is not"):
        load_sts_task(tmp_path, "STSBenchmark", "dev")


def test_sts_year_row_without_tab_names_line(tmp_path):
    """A pair line without its tab: file and line named (rows without a gold score are still dropped)."""
    folder = write_sts_year(tmp_path, "STS12", {"MSRpar": [("a", "b", 1.0), ("c", "d", None), ("e", "f", 2.0)]})
    path = folder / "STS.input.MSRpar.txt"
    path.write_text("a\tb\nc\td\nef\n")
    with pytest.raises(ValueError, match=r"STS\.input\.MSRpar\.txt, line 3: expected 2 tab-separated columns"):
        load_sts_task(tmp_path, "STS12")
