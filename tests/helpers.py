"""Builders shared by the tests: tiny random backbones with toy tokenizers, SentEval-format files, a fake encoder.

Everything here is offline and deterministic; `conftest.py` wraps the expensive pieces in session fixtures.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import torch

SPECIAL_BERT = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = (
    "the a an is are was were cat dog man woman boy girl child kid plays playing runs running eats eating food "
    "ball park street house car red blue green big small happy sad fast slow on in at with and of to guitar "
    "music piano sings dances water drinks tree bird flies sky ."
).split()

TINY_DIMS = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
                 max_position_embeddings=64)


def random_sentences(n: int, seed: int = 0, min_words: int = 3, max_words: int = 9) -> list[str]:
    """`n` distinct random sentences made of in-vocabulary words."""
    rng = random.Random(seed)
    content = [w for w in WORDS if w != "."]
    out: dict[str, None] = {}
    while len(out) < n:
        out[" ".join(rng.choice(content) for _ in range(rng.randint(min_words, max_words)))] = None
    return list(out)


# ---------------------------------------------------------------------------------------------- tiny models
def write_wordpiece_vocab(path: Path, extra_words: int = 0, pad_index: int = 0) -> Path:
    """A toy WordPiece vocab file: the BERT special tokens + WORDS (+ `extra_words` filler tokens)."""
    tokens = list(SPECIAL_BERT) + WORDS + [f"extra{i}" for i in range(extra_words)]
    if pad_index:
        tokens.remove("[PAD]")
        tokens.insert(pad_index, "[PAD]")
    path.write_text("\n".join(tokens) + "\n")
    return path


def bert_tokenizer_from_vocab_file(vocab_file: Path):
    """A fast WordPiece tokenizer for a vocab file.

    transformers 5 ignores `BertTokenizerFast(vocab_file=...)` (it silently builds a 5-token vocab), so the file
    is read into the `vocab` dict that the v5 constructor takes.
    """
    from transformers import BertTokenizerFast

    tokens = vocab_file.read_text().splitlines()
    tokenizer = BertTokenizerFast(vocab={t: i for i, t in enumerate(tokens)})
    assert len(tokenizer) == len(tokens)
    return tokenizer


def build_tiny_bert(directory: Path, seed: int = 0, **config_overrides) -> Path:
    """Save a randomly initialised 2-layer BERT (hidden 32) and its toy tokenizer into `directory`."""
    from transformers import BertConfig, BertModel

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = bert_tokenizer_from_vocab_file(write_wordpiece_vocab(directory / "vocab.txt"))
    config = BertConfig(vocab_size=len(tokenizer), **{**TINY_DIMS, **config_overrides})
    torch.manual_seed(seed)
    BertModel(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def build_tiny_roberta(directory: Path, seed: int = 0, **config_overrides) -> Path:
    """Save a randomly initialised 2-layer RoBERTa with a tiny byte-level BPE trained on WORDS into `directory`."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaConfig, RobertaModel, RobertaTokenizer

    directory.mkdir(parents=True, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        [" ".join(WORDS)] * 3, vocab_size=320, min_frequency=1, show_progress=False,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
    )
    raw = directory / "bpe"
    raw.mkdir(exist_ok=True)
    bpe.save_model(str(raw))
    vocab = json.loads((raw / "vocab.json").read_text())
    merges = [tuple(line.split()) for line in (raw / "merges.txt").read_text().splitlines()[1:] if line.strip()]
    tokenizer = RobertaTokenizer(vocab=vocab, merges=merges)
    config = RobertaConfig(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id, **{**TINY_DIMS, **config_overrides},
    )
    torch.manual_seed(seed)
    RobertaModel(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


# ---------------------------------------------------------------------------------------------- SentEval layout
def declare_size(path: Path, pairs: int) -> None:
    """Record `path`'s number of scored pairs in its folder's sizes.json, which the readers check instead of the
    sizes of SentEval's own files (`hf_sentcl.evaluation.sts.KNOWN_PAIRS`)."""
    manifest = path.parent / "sizes.json"
    sizes = json.loads(manifest.read_text()) if manifest.is_file() else {}
    manifest.write_text(json.dumps({**sizes, path.name: pairs}))


def write_sts_year(root: Path, year: str, subsets: dict[str, list[tuple[str, str, float | None]]]) -> Path:
    """STS/<year>-en-test/STS.input.<subset>.txt (tab-separated pairs) + STS.gs.<subset>.txt (score or empty)."""
    folder = root / "STS" / f"{year}-en-test"
    folder.mkdir(parents=True, exist_ok=True)
    for subset, rows in subsets.items():
        (folder / f"STS.input.{subset}.txt").write_text("".join(f"{a}\t{b}\n" for a, b, _ in rows))
        declare_size(folder / f"STS.input.{subset}.txt", sum(score is not None for _, _, score in rows))
        (folder / f"STS.gs.{subset}.txt").write_text(
            "".join(("" if score is None else f"{score:.3f}") + "\n" for _, _, score in rows)
        )
    return folder


def write_stsb(root: Path, split: str, rows: list[tuple[str, str, float]]) -> Path:
    """STS/STSBenchmark/sts-<split>.csv: genre, file, year, id, score, sentence1, sentence2 (tab-separated)."""
    folder = root / "STS" / "STSBenchmark"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"sts-{split}.csv"
    path.write_text(
        "".join(f"main-captions\tMSRvid\t2012test\t{i:04d}\t{s:.3f}\t{a}\t{b}\n" for i, (a, b, s) in enumerate(rows))
    )
    declare_size(path, len(rows))
    return path


SICK_FILES = {"train": "SICK_train.txt", "dev": "SICK_trial.txt", "test": "SICK_test_annotated.txt"}


def write_sick(root: Path, split: str, rows: list[tuple[str, str, float]]) -> Path:
    """SICK/<file>: header + pair_ID, sentence_A, sentence_B, relatedness_score, entailment (CRLF, like SentEval)."""
    folder = root / "SICK"
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment"]
    lines += [f"{i + 1}\t{a}\t{b}\t{s:.1f}\tNEUTRAL" for i, (a, b, s) in enumerate(rows)]
    path = folder / SICK_FILES[split]
    path.write_bytes(("\r\n".join(lines) + "\r\n").encode())
    declare_size(path, len(rows))
    return path


def random_pairs(n: int, seed: int, blank_every: int = 0) -> list[tuple[str, str, float | None]]:
    """`n` random in-vocabulary sentence pairs with scores in [0, 5]; every `blank_every`-th gold score is empty."""
    rng = random.Random(seed)
    sentences = random_sentences(2 * n, seed=seed)
    rows = []
    for i in range(n):
        score = round(rng.uniform(0, 5), 2)
        rows.append((sentences[2 * i], sentences[2 * i + 1], None if blank_every and i % blank_every == 1 else score))
    return rows


def write_full_senteval(root: Path, pairs_per_subset: int = 10, seed: int = 0) -> Path:
    """A small SentEval layout with all 7 STS tasks: STS12 with two subsets (MSRpar, MSRvid), STS13-16 with
    their first subset, STS-B train/dev/test and SICK train/trial/test. Some STS gold lines are empty."""
    from hf_sentcl.evaluation.sts import STS_YEAR_SUBSETS

    root.mkdir(parents=True, exist_ok=True)
    k = seed
    for year, names in STS_YEAR_SUBSETS.items():
        chosen = names[:2] if year == "STS12" else names[:1]
        subsets = {}
        for name in chosen:
            k += 1
            subsets[name] = random_pairs(pairs_per_subset + 3 * (k % 2), seed=k, blank_every=4)
        write_sts_year(root, year, subsets)
    for split in ("train", "dev", "test"):
        k += 1
        write_stsb(root, split, random_pairs(pairs_per_subset, seed=k))
        k += 1
        write_sick(root, split, random_pairs(pairs_per_subset, seed=k))
    return root


# ---------------------------------------------------------------------------------------------- fake encoder
class FakeEncoder:
    """Stands in for a SentenceEncoder: returns chosen vectors per sentence and records its calls."""

    def __init__(self, vectors: dict[str, np.ndarray]):
        self.vectors = vectors
        self.calls: list[dict] = []

    def encode(self, sentences, batch_size=128, bf16=False):
        self.calls.append({"sentences": list(sentences), "batch_size": batch_size, "bf16": bf16})
        return np.stack([self.vectors[s] for s in sentences])
