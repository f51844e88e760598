"""Hard-negative mining (`hf_sentcl.data.mining`, `hf-sentcl mine`): the choices on hand-made embeddings whose
cosines are known, the block search against a full top-k, the size limit, input checks and a CLI run whose CSV the
supervised SimCSE data loading reads."""

import csv
import math
import re

import pytest
import torch
from helpers import random_sentences

from hf_sentcl.cli.mine import main as mine_main
from hf_sentcl.data.mining import (
    MiningSettings,
    Pairs,
    block_topk,
    mine_from_embeddings,
    read_pairs,
)
from hf_sentcl.data.provenance import provenance_path, read_provenance
from hf_sentcl.pipeline.build import build_train_dataset
from hf_sentcl.recipe.metadata import training_data_summary
from hf_sentcl.recipe.parser import parse_recipe
from hf_sentcl.recipe.plan import plan_run

# Unit vectors in the plane at these angles (degrees) from the anchor: cosine to the anchor = cos(angle).
# After the anchor and the positive are removed, the ranking is c05 (0.996), c15 (0.966), c25 (0.906), c40 (0.766),
# c60 (0.5), c90 (0.0); the positive scores cos(10) = 0.985.
ANGLES = {"anchor": 0, "positive": 10, "c05": 5, "c15": 15, "c25": 25, "c40": 40, "c60": 60, "c90": 90}


def unit(degrees: float) -> torch.Tensor:
    return torch.tensor([math.cos(math.radians(degrees)), math.sin(math.radians(degrees))])


def mine(pool: dict[str, float], positive_angle: float = 10, **settings) -> tuple[list[str], int, dict]:
    """Mine one pair (anchor at 0 degrees, positive at `positive_angle`) against `pool` (text -> angle)."""
    pairs = Pairs(["anchor"], ["positive"], "hand-made")
    texts = list(pool)
    result = mine_from_embeddings(
        unit(0)[None], unit(positive_angle)[None], torch.stack([unit(pool[t]) for t in texts]), pairs, texts,
        MiningSettings(**settings),
    )
    return [neg for _, _, neg in result.rows], result.dropped, result.skipped


@pytest.mark.parametrize(
    "settings, expected",
    [
        ({}, "c05"),  # the best-ranked candidate that is neither the anchor nor the positive
        ({"rank_start": 2, "rank_end": 4}, "c25"),  # ranks 2-3: c25, c40
        ({"absolute_margin": 0.05}, "c25"),  # skip score + 0.05 > 0.985: c05, c15
        ({"absolute_margin": 0.2}, "c40"),  # threshold 0.785: c25 (0.906) goes too
        ({"relative_margin": 0.1}, "c40"),  # threshold 0.985 - 0.0985 = 0.886: c25 (0.906) skipped
        ({"relative_margin": 0.01}, "c15"),  # threshold 0.975: only c05 skipped
        ({"relative_margin": 0.1, "rank_start": 4}, "c60"),
    ],
)
def test_choice_on_known_cosines(settings, expected):
    assert mine(ANGLES, **settings)[0] == [expected]


def test_window_is_counted_before_the_margins_and_an_empty_window_drops_the_pair():
    """Ranks 0-1 are c05 and c15, both within 0.05 of the positive: nothing survives, the pair is dropped."""
    negatives, dropped, skipped = mine(ANGLES, rank_end=2, absolute_margin=0.05)
    assert negatives == [] and dropped == 1
    assert skipped == {"absolute_margin": 2}


def test_ranks_past_the_window_are_never_chosen():
    """The pool's copy of the positive lies far away (170 degrees), so the search's room for it holds c25 at rank 2:
    outside window 0:2, it must not be chosen when the margin removes c05 and c15."""
    pool = {**ANGLES, "positive": 170}
    assert mine(pool, rank_end=2, absolute_margin=0.05)[:2] == ([], 1)
    assert mine(pool, rank_end=3, absolute_margin=0.05)[0] == ["c25"]


def test_relative_margin_uses_the_positive_magnitude():
    """A positive scoring cos(120) = -0.5: sentence-transformers 6.x skips scores above -0.5 - 0.5 * 0.1 = -0.55
    (the older `positive * (1 - margin)` = -0.45 would keep the candidate at -0.52)."""
    pool = {"c121": math.degrees(math.acos(-0.52)), "c180": 180, "c90": 90}
    assert mine(pool, positive_angle=120, relative_margin=0.1)[0] == ["c180"]


def test_text_equal_to_anchor_or_positive_is_never_chosen():
    """Copies of the anchor and the positive that differ in whitespace only (closest of all) are skipped, and the
    ranks do not count them: window 0:1 still holds c05."""
    pool = {**ANGLES, "  anchor ": 1, "positive\t": 2, "anchor\n": 3}
    assert mine(pool, rank_end=1)[0] == ["c05"]
    assert mine(pool, rank_start=1, rank_end=2)[0] == ["c15"]


def test_seeded_sampling_is_deterministic_and_stays_among_survivors():
    """Window 0:4 with absolute margin 0.05 leaves c25 and c40 (c05, c15 too close); random picks between them."""
    n = 64
    pairs = Pairs(["anchor"] * n, ["positive"] * n, "hand-made")
    texts = list(ANGLES)
    pool = torch.stack([unit(ANGLES[t]) for t in texts])

    def run(seed):
        settings = MiningSettings(rank_end=4, absolute_margin=0.05, sampling="random", seed=seed)
        result = mine_from_embeddings(unit(0).expand(n, 2), unit(10).expand(n, 2), pool, pairs, texts, settings)
        return [neg for _, _, neg in result.rows]

    first = run(seed=0)
    assert first == run(seed=0)
    assert set(first) == {"c25", "c40"}
    assert first != run(seed=1)


@pytest.mark.parametrize("block_size, query_block", [(1, 4), (7, 5), (50, 1024), (101, 3), (500, 1024)])
@pytest.mark.parametrize("k", [10, 200])
def test_block_search_equals_full_topk(block_size, query_block, k):
    generator = torch.Generator().manual_seed(0)
    queries, pool = torch.randn(37, 16, generator=generator), torch.randn(101, 16, generator=generator)
    scores, indices = block_topk(queries, pool, k, block_size=block_size, query_block=query_block)
    expected_scores, expected_indices = (queries @ pool.T).topk(min(k, len(pool)), dim=1)
    assert torch.equal(indices, expected_indices)
    torch.testing.assert_close(scores, expected_scores)


def test_pool_above_the_limit_is_refused_naming_size_and_limit():
    texts = list(ANGLES)
    pool = torch.stack([unit(ANGLES[t]) for t in texts])
    with pytest.raises(ValueError, match=r"8 sentences, above the exact search's limit of 7 \(--max-pool\)"):
        mine_from_embeddings(unit(0)[None], unit(10)[None], pool, Pairs(["anchor"], ["positive"], "x"), texts,
                             MiningSettings(max_pool=7))


def test_stsb_pairs_keep_scores_at_least_min_score(senteval_dir):
    from hf_sentcl.evaluation.sts import load_sts_task

    gold = load_sts_task(senteval_dir, "STSBenchmark", "train")["train"]
    threshold = float(sorted(gold.scores)[len(gold) // 2])  # a score some pairs have exactly: they are kept
    pairs = read_pairs("stsb", min_score=threshold, data_dir=senteval_dir)
    expected = [a.strip() for a, score in zip(gold.sentences1, gold.scores) if score >= threshold]
    assert pairs.anchors == expected and 0 < len(pairs) < len(gold)
    assert pairs.skipped == len(gold) - len(expected)


def write_pairs(path, rows, header=("sent0", "sent1")):
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--pairs", "{tmp}/missing.csv"], "--pairs '.*missing.csv' does not exist"),
        (["--columns", "premise,hypothesis"], r"no column\(s\) \['premise', 'hypothesis'\] \(--columns\)"),
        (["--pairs", "{tmp}/empty.csv"], "no pairs to mine from"),
        (["--rank-window", "5:2"], "--rank-window 5:2"),
        (["--rank-window", "ten"], "--rank-window 'ten'"),
        (["--absolute-margin", "-0.1"], "--absolute-margin -0.1"),
        (["--relative-margin", "nan"], "--relative-margin nan"),
        (["--min-score", "4"], "--min-score applies to STS-B pairs"),
        (["--corpus", "{tmp}/nothing.txt"], "--corpus '.*nothing.txt' does not exist"),
        (["--max-pool", "3"], r"above the exact search's limit of 3 \(--max-pool\)"),
        (["--mteb-dataset", ":train"], "--mteb-dataset ':train': expected an MTEB task name"),
        ([], "--model '.*no-model': no folder"),
    ],
)
def test_bad_input_is_refused_before_the_model_loads(tmp_path, capsys, extra, message):
    """Exit status 2 and an error naming the file or option, before any model loads (`--model` names nothing)."""
    write_pairs(tmp_path / "pairs.csv", [("a b c", "a b d"), ("e f g", "e f h")])
    write_pairs(tmp_path / "empty.csv", [("", "x")])
    argv = ["--model", str(tmp_path / "no-model"), "--pairs", str(tmp_path / "pairs.csv"),
            "--output", str(tmp_path / "out.csv")]
    assert mine_main(argv + [a.format(tmp=tmp_path) for a in extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and re.search(message, err), err


def test_cli_writes_a_csv_that_supervised_simcse_reads(tmp_path, tiny_bert_dir, senteval_dir, capsys):
    sentences = random_sentences(60, seed=11)
    pairs = write_pairs(tmp_path / "pairs.csv", list(zip(sentences[:20], sentences[20:40])), header=("q", "p"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(sentences[40:]) + "\n\n")
    output = tmp_path / "mined.csv"
    argv = ["--model", str(tiny_bert_dir), "--pooling", "mean", "--pairs", str(pairs), "--columns", "q,p",
            "--corpus", str(corpus), "--rank-window", "1:10", "--sampling", "random", "--seed", "3",
            "--block-size", "16", "--output", str(output)]
    assert mine_main(argv) == 0
    printed = capsys.readouterr().out
    assert "Pairs in: 20" in printed and "Candidate pool: 60 sentences" in printed
    with output.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert rows and list(rows[0]) == ["sent0", "sent1", "hard_neg"]
    assert all(r["hard_neg"] not in (r["sent0"], r["sent1"]) and r["hard_neg"] in sentences for r in rows)
    first = output.read_bytes()
    assert mine_main(argv) == 0 and output.read_bytes() == first  # deterministic with the seed
    # the user's own pairs: nothing is declared unless the user says where they came from
    assert read_provenance(output)["mteb_datasets"] == {}
    assert mine_main([*argv, "--mteb-dataset", "SICK-R:test", "--mteb-dataset", "SICK-R:train"]) == 0
    assert read_provenance(output)["mteb_datasets"] == {"SICK-R": ["test", "train"]}

    recipe = parse_recipe(
        None, method="simcse_sup", model_name_or_path=str(tiny_bert_dir), train_file=str(output),
        sts_data_dir=str(senteval_dir), output_dir=str(tmp_path / "run"), per_device_train_batch_size=4,
    )
    from hf_sentcl import SentenceEncoder

    tokenizer = SentenceEncoder.load(str(tiny_bert_dir)).tokenizer
    dataset, num_views, _ = build_train_dataset(recipe, tokenizer)
    assert num_views == 3 and len(dataset) == len(rows)


def test_cli_mines_stsb_pairs(tmp_path, tiny_bert_dir, senteval_dir, capsys):
    output = tmp_path / "stsb.csv"
    argv = ["--model", str(tiny_bert_dir), "--pairs", "stsb", "--data-dir", str(senteval_dir), "--min-score", "2",
            "--output", str(output)]
    assert mine_main(argv) == 0
    expected = len(read_pairs("stsb", min_score=2.0, data_dir=senteval_dir))
    assert f"Pairs in: {expected}" in capsys.readouterr().out
    with output.open(newline="") as handle:
        assert len(list(csv.DictReader(handle))) <= expected
    # the file declares its origin (SentEval's dev split is MTEB's validation split) and a run on it copies it
    assert mine_main([*argv[:3], "stsb:dev", *argv[4:]]) == 0
    assert read_provenance(output)["mteb_datasets"] == {"STSBenchmark": ["validation"]}
    recipe = parse_recipe(None, method="simcse_sup", model_name_or_path=str(tiny_bert_dir), train_file=str(output),
                          output_dir=str(tmp_path / "run"))
    summary = training_data_summary(plan_run(recipe).stages[-1], 10, ["sent0", "sent1", "hard_neg"])
    assert summary["mteb_datasets"] == {"STSBenchmark": ["validation"]}


def test_a_provenance_file_that_is_not_an_object_is_refused_naming_it(tmp_path):
    train_file = tmp_path / "mined.csv"
    train_file.write_text("sent0,sent1,hard_neg\na,b,c\n")
    provenance_path(train_file).write_text("[1, 2]")
    with pytest.raises(TypeError, match=r"mined.csv.provenance.json: expected a JSON object"):
        read_provenance(train_file)
    provenance_path(train_file).write_text("{oops")
    with pytest.raises(ValueError, match=r"mined.csv.provenance.json: not valid JSON"):
        read_provenance(train_file)



# ------------------------------------------------------------------------------------------- repeated anchors
# Anchor "a" has three positives (rows 0, 1 and 3); "b" has one, pb, far from both anchors. Angles in degrees from the
# anchors (both at 0 degrees): a's candidates, best first, are pa2 (3), c05 (5), pa1 (10), c15, pa3 (17), c25, pb (30).
GROUP_ANGLES = {"pa1": 10, "pa2": 3, "pa3": 17, "pb": 30, "c05": 5, "c15": 15, "c25": 25, "c40": 40}
GROUP_PAIRS = Pairs(["a", "a", "b", "a"], ["pa1", "pa2", "pb", "pa3"], "hand-made")


def mine_groups(**settings) -> list[str]:
    texts = list(GROUP_ANGLES)
    result = mine_from_embeddings(
        unit(0).expand(4, 2), torch.stack([unit(GROUP_ANGLES[p]) for p in GROUP_PAIRS.positives]),
        torch.stack([unit(GROUP_ANGLES[t]) for t in texts]), GROUP_PAIRS, texts, MiningSettings(**settings),
    )
    assert [(a, p) for a, p, _ in result.rows] == list(zip(GROUP_PAIRS.anchors, GROUP_PAIRS.positives))
    return [neg for _, _, neg in result.rows]


@pytest.mark.parametrize(
    "settings, expected",
    [
        # no row of "a" may take pa1, pa2 or pa3 (mining row 0 alone would take pa2, row 1 alone pa1); b's only
        # positive is pb, so a's positive pa2 is b's closest candidate
        ({}, ["c05", "c05", "pa2", "c05"]),
        # rank 1 once a's positives are out: c15; b's rank 1: c05
        ({"rank_start": 1, "rank_end": 2}, ["c15", "c15", "c05", "c15"]),
        # the margin comes from a's SMALLEST positive score, cos(17) = 0.956: threshold 0.936 skips c05 (0.996) and
        # c15 (0.966) for every row of "a" (row 1's own positive, cos(3) = 0.9986, would keep c15); b's positive
        # cos(30) = 0.866 -> threshold 0.846 leaves c40 (0.766) first
        ({"absolute_margin": 0.02}, ["c25", "c25", "c40", "c25"]),
        # relative: a's threshold 0.956 - 0.956 * 0.01 = 0.947 -> c25 (0.906); b's 0.866 * 0.99 = 0.857 -> c40
        ({"relative_margin": 0.01}, ["c25", "c25", "c40", "c25"]),
    ],
)
def test_repeated_anchor_excludes_all_its_positives_and_takes_the_smallest_positive_score(settings, expected):
    """As sentence-transformers' `mine_hard_negatives`: an anchor repeated over several pairs is mined against the
    candidates minus EVERY positive it has, and a margin compares with its hardest (lowest-scoring) positive."""
    assert mine_groups(**settings) == expected


#: the candidates alone (the anchor and positive texts are never candidates of their own pair anyway)
POOL = {name: angle for name, angle in ANGLES.items() if name.startswith("c")}


@pytest.mark.parametrize(
    "settings, expected",
    [
        ({"num_negatives": 3}, ["c05", "c15", "c25"]),  # the three best-ranked, a row each
        ({"num_negatives": 3, "rank_window": (1, 30)}, ["c15", "c25", "c40"]),
        ({"num_negatives": 3, "relative_margin": 0.05}, ["c25", "c40", "c60"]),  # c05 and c15 score above 0.936
        ({"num_negatives": 6}, ["c05", "c15", "c25", "c40", "c60", "c90"]),
    ],
)
def test_several_negatives_per_pair_by_hand(settings, expected):
    start, end = settings.pop("rank_window", (0, 30))
    negatives, dropped, _ = mine(POOL, rank_start=start, rank_end=end, **settings)
    assert negatives == expected and dropped == 0


def test_n_tuples_keep_only_pairs_with_every_negative():
    pairs = Pairs(["anchor", "other"], ["positive", "other positive"], "hand-made")
    texts = list(POOL)
    pool = torch.stack([unit(POOL[t]) for t in texts])
    anchors, positives = torch.stack([unit(0), unit(0)]), torch.stack([unit(10), unit(10)])
    settings = MiningSettings(num_negatives=2, output_format="n-tuple", rank_end=2)
    result = mine_from_embeddings(anchors, positives, pool, pairs, texts, settings)
    assert result.rows == [("anchor", "positive", "c05", "c15"), ("other", "other positive", "c05", "c15")]
    narrow = MiningSettings(num_negatives=2, output_format="n-tuple", rank_end=2, absolute_margin=0.02)
    # c05 and c15 fall to the margin, the window holds nothing else
    assert mine_from_embeddings(anchors, positives, pool, pairs, texts, narrow).dropped == 2
    assert settings.columns() == ("sent0", "sent1", "hard_neg_1", "hard_neg_2")


@pytest.mark.parametrize("options, bad", [(["--num-negatives", "0"], "--num-negatives 0"),
                                          (["--num-negatives", "40"], "--num-negatives 40")])
def test_a_count_of_negatives_the_window_cannot_hold_is_refused(options, bad, tmp_path, tiny_bert_dir, capsys):
    argv = ["--model", str(tiny_bert_dir), "--pairs", str(tmp_path / "none.csv"), "--output", str(tmp_path / "o.csv")]
    assert mine_main(argv + options) == 2 and bad in capsys.readouterr().err


def test_cli_writes_several_negatives_with_unix_line_ends(tmp_path, tiny_bert_dir, senteval_dir):
    output = tmp_path / "mined.csv"
    argv = ["--model", str(tiny_bert_dir), "--pooling", "mean", "--pairs", "stsb", "--data-dir", str(senteval_dir),
            "--min-score", "0", "--num-negatives", "3", "--output", str(output)]
    assert mine_main(argv) == 0
    data = output.read_bytes()
    assert b"\r" not in data and data.startswith(b"sent0,sent1,hard_neg\n")
    with output.open(newline="") as handle:
        rows = list(csv.reader(handle))[1:]
    per_pair = {}
    for anchor, positive, negative in rows:
        per_pair.setdefault((anchor, positive), []).append(negative)
    assert per_pair and all(len(negs) == 3 and len(set(negs)) == 3 for negs in per_pair.values())
    tuples = tmp_path / "tuples.csv"
    assert mine_main([*argv[:-1], str(tuples), "--output-format", "n-tuple"]) == 0
    header = tuples.read_text().splitlines()[0]
    assert header == "sent0,sent1,hard_neg_1,hard_neg_2,hard_neg_3"
