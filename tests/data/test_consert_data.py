"""ConSERT's unlabeled STS corpus: every input row counted, and the paper's 89,192 texts on the real data."""



# ------------------------------------------------------------------------------------------ unlabeled STS corpus
def test_unlabeled_sts_counts_every_input_row(senteval_dir):
    """'all' takes both sentences of every STS12-16 input row, scored or not, plus every STS-B and SICK split;
    'all-scored' leaves out the rows without a gold score (the fixture blanks some)."""
    from hf_sentcl.evaluation.sts import (
        STS_TASKS,
        load_sts_task,
        read_lines,
        unlabeled_sts_sentences,
        unlabeled_sts_texts,
    )

    rows = 0
    scored = 0
    for task in STS_TASKS[:5]:
        folder = senteval_dir / "STS" / f"{task}-en-test"
        for subset, pairs in load_sts_task(senteval_dir, task).items():
            rows += len(read_lines(folder / f"STS.input.{subset}.txt"))
            scored += len(pairs)
    splits = sum(len(p) for t in STS_TASKS[5:] for s in ("train", "dev", "test") for p in load_sts_task(
        senteval_dir, t, s).values())
    assert rows > scored
    assert len(unlabeled_sts_texts(senteval_dir, "all")) == 2 * (rows + splits)
    assert len(unlabeled_sts_texts(senteval_dir, "all-scored")) == 2 * (scored + splits)
    everything = unlabeled_sts_sentences(senteval_dir, "all")
    assert len(everything) == len(set(everything)) > len(unlabeled_sts_sentences(senteval_dir, "all-scored"))


def test_unlabeled_sts_is_the_papers_89192_texts(real_data_dir):
    """ConSERT's Table 1: 89,192 unlabeled texts (48,699 distinct); the scored rows alone give 30,840 distinct."""
    from hf_sentcl.evaluation.sts import unlabeled_sts_sentences, unlabeled_sts_texts

    texts = unlabeled_sts_texts(real_data_dir, "all")
    assert len(texts) == 89192 and len(set(texts)) == 48699
    assert len(unlabeled_sts_sentences(real_data_dir, "all")) == 48699
    assert len(unlabeled_sts_sentences(real_data_dir, "all-scored")) == 30840
    assert len(unlabeled_sts_texts(real_data_dir, "stsb")) == 2 * 8628
