"""How many in-batch pairs `false_negatives: mask` takes out of the loss on the shipped corpora, per batch.

    HF_SENTCL_DATA=/path/to/senteval python benchmarks/false_negatives.py [--batch-sizes 64,512] [--epochs 3]
        [--write-triplets nli_triplets.csv]

Corpora: the Wikipedia subset (`$HF_SENTCL_DATA/../wiki1m_subset.txt`; unsupervised SimCSE's rule) and NLI triplets
built from SentEval's SNLI dev and test files (`$HF_SENTCL_DATA/SNLI`; supervised SimCSE's rule with the hard-negative
column), the way SimCSE built its `nli_for_simcse.csv`: one (premise, entailment, contradiction) row per
entailment of a premise, its contradictions taken in turn, so a premise with two entailments gives two rows.
`--write-triplets` also writes those triplets as the `sent0,sent1,hard_neg` CSV that `simcse_sup` trains on.

Texts are tokenized with the embedded all-MiniLM-L6-v2 tokenizer and truncated to --max-seq-length, as training
does; batches are shuffled like the Trainer's sampler (one permutation per epoch). Counted per batch: masked
(anchor, candidate) pairs, and the batches with at least one.
"""

from __future__ import annotations

import argparse
import csv
import os
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer

from hf_sentcl.configs.choices import EMBEDDED_MODEL_ALIAS
from hf_sentcl.losses.false_negatives import info_nce_mask, text_groups
from hf_sentcl.modeling.backbone import resolve_model_name


def snli_triplets(folder: Path) -> list[tuple[str, str, str]]:
    """(premise, entailment, contradiction) rows from SentEval's SNLI files (s1/s2/labels, dev and test)."""
    hypotheses: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for split in ("dev", "test"):
        lines = [(folder / f"{n}.{split}").read_text(encoding="utf-8").splitlines() for n in ("s1", "s2", "labels")]
        for premise, hypothesis, label in zip(*lines):
            hypotheses[premise.strip()][label.strip()].append(hypothesis.strip())
    rows = []
    for premise, by_label in hypotheses.items():
        contradictions = by_label.get("contradiction", [])
        for i, entailment in enumerate(by_label.get("entailment", [])):
            if contradictions:
                rows.append((premise, entailment, contradictions[i % len(contradictions)]))
    return rows


def groups(tokenizer, texts: list[str], max_length: int) -> torch.Tensor:
    encoded = tokenizer(texts, truncation=True, max_length=max_length, padding=True, return_tensors="pt")
    return text_groups(encoded["input_ids"], encoded["attention_mask"])


def masked_per_batch(columns: list[torch.Tensor], batch_size: int, epochs: int, seed: int) -> np.ndarray:
    """Masked pairs of every batch of `epochs` shuffled epochs; `columns` are the (rows,) text groups of anchor,
    positive [and hard negative] (one column for unsupervised data: anchor = positive)."""
    rng = np.random.default_rng(seed)
    counts = []
    rows = len(columns[0])
    for _ in range(epochs):
        order = torch.from_numpy(rng.permutation(rows))
        for start in range(0, rows - batch_size + 1, batch_size):  # drop the last, short batch
            batch = [c[order[start : start + batch_size]] for c in columns]
            anchors, positives = batch[0], batch[1] if len(batch) > 1 else batch[0]
            counts.append(int(info_nce_mask(anchors, positives, *batch[2:]).sum()))
    return np.array(counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", default="64,512")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--max-seq-length", type=int, default=32)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--write-triplets", default=None, help="Also write the SNLI triplets as a CSV here.")
    args = parser.parse_args()
    data = Path(os.environ.get("HF_SENTCL_DATA", "")).expanduser()
    if not (data / "SNLI").is_dir():
        raise SystemExit("Set HF_SENTCL_DATA to the SentEval data directory (with SNLI/ and ../wiki1m_subset.txt).")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_name(EMBEDDED_MODEL_ALIAS))
    wiki = [line.strip() for line in (data.parent / "wiki1m_subset.txt").read_text(encoding="utf-8").splitlines()]
    wiki = [line for line in wiki if line]
    triplets = snli_triplets(data / "SNLI")
    if args.write_triplets:
        with open(args.write_triplets, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["sent0", "sent1", "hard_neg"])
            writer.writerows(triplets)
        print(f"wrote {len(triplets)} triplets to {args.write_triplets}")
    # one tokenization of every text: the groups of one column are comparable with another's
    all_triplet_texts = [t for row in triplets for t in row]
    triplet_groups = groups(tokenizer, all_triplet_texts, args.max_seq_length).view(-1, 3).T
    corpora = {
        "wiki1m_subset (unsup)": [groups(tokenizer, wiki, args.max_seq_length)],
        "SNLI triplets (sup)": list(triplet_groups),
    }
    print(f"{len(wiki)} Wikipedia sentences ({len(wiki) - len(set(wiki))} repeated lines); {len(triplets)} SNLI "
          f"triplets ({len(triplets) - len({t[0] for t in triplets})} rows repeat a premise); max_len "
          f"{args.max_seq_length}, {args.epochs} shuffled epochs\n")
    print("| corpus | batch | masked pairs per batch (mean) | max | batches with any | pairs in a batch |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, columns in corpora.items():
        for batch_size in (int(b) for b in args.batch_sizes.split(",")):
            counts = masked_per_batch(columns, batch_size, args.epochs, args.seed)
            pairs = batch_size * batch_size * (2 if len(columns) == 3 else 1)  # rows x candidate columns
            print(f"| {name} | {batch_size} | {counts.mean():.2f} | {counts.max()} | "
                  f"{(counts > 0).mean() * 100:.1f}% | {pairs:,} |")


if __name__ == "__main__":
    main()
