"""Hard-negative mining: (anchor, positive) pairs -> the (sent0, sent1, hard_neg) triplets supervised SimCSE reads.

For each pair, the candidates are the sentences of a pool (a corpus, the pairs' own sentences, or both), ranked by
the encoder's cosine to the *anchor*: the loss scores the hard negative against the anchor (sent0's row of the
similarity matrix), and the margins compare a candidate's score with the anchor-positive score, which only means
something if both are scores to the anchor (sentence-transformers' `mine_hard_negatives` ranks the same way).

Pairs whose anchors have the same text are one group, as in sentence-transformers: an anchor with several positives
has all of them as positives. A candidate is never the anchor nor any positive of its group: any candidate whose text
equals one of them (after stripping whitespace) is removed before ranks are counted, so one pair's positive is never
the hard negative of another pair of the same anchor. Ranks count from 0 over what remains, and only ranks in the
window `[start, end)` are kept; then the margins drop candidates that score too close to the positive, with
sentence-transformers 6.x's definitions (`sentence_transformers/util/hard_negatives.py`), where `positive_score` is
the group's SMALLEST anchor-positive score (its hardest positive, sentence-transformers' choice):

- absolute margin m: skipped when `score + m > positive_score`;
- relative margin r: skipped when `score > positive_score - |positive_score| * r` (it subtracts `|positive| * r`
  rather than multiplying by `1 - r`, which would raise the threshold for a negative positive score).

The window is counted before the margins, so a window means the same ranks with or without them (in
sentence-transformers, `range_min` counts the candidates that survive the margins), and the anchor's own text is
never a candidate (sentence-transformers ranks it like any other sentence of its corpus). Each pair keeps its row:
every row of a group gets a negative (the same one with `top`), and a pair repeated verbatim stays repeated
(sentence-transformers writes it once). Among the survivors the
negative is the highest-ranked (`top`) or one drawn uniformly with a seeded generator (`random`); a pair with no
survivor is dropped and counted. The search is exact: cosine scores in torch, by blocks of the pool, the top-k of
each block merged with the running top-k, so memory stays at one (queries x block) score matrix; a pool above
`max_pool` sentences is refused before anything is encoded.
"""

from __future__ import annotations

import csv
import math
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from hf_sentcl.data.provenance import STSB_MTEB_SPLITS
from hf_sentcl.evaluation.sts import load_sts_task, read_stsbenchmark

MINED_COLUMNS = ("sent0", "sent1", "hard_neg")
SAMPLING = ("top", "random")
#: sentence-transformers' output formats: a row per negative, or one row with all of an anchor's negatives
OUTPUT_FORMATS = ("triplet", "n-tuple")
DEFAULT_MAX_POOL = 1_000_000
DEFAULT_BLOCK_SIZE = 16_384
QUERY_BLOCK = 1_024
STSB_PREFIX = "stsb"  # `stsb` or `stsb:SPLIT`: STS-B of the SentEval data directory


@dataclass(frozen=True)
class MiningSettings:
    """How candidates are chosen (see the module docstring); each error names the command-line option at fault."""

    rank_start: int = 0
    rank_end: int = 30
    absolute_margin: float | None = None
    relative_margin: float | None = None
    sampling: str = "top"
    seed: int = 42
    max_pool: int = DEFAULT_MAX_POOL
    block_size: int = DEFAULT_BLOCK_SIZE
    num_negatives: int = 1
    output_format: str = "triplet"

    def __post_init__(self) -> None:
        if not 0 <= self.rank_start < self.rank_end:
            raise ValueError(
                f"--rank-window {self.rank_start}:{self.rank_end}: need 0 <= START < END (ranks count from 0)."
            )
        for option, value in (("--absolute-margin", self.absolute_margin), ("--relative-margin", self.relative_margin)):
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{option} {value}: a margin is a finite number >= 0.")
        if self.sampling not in SAMPLING:
            raise ValueError(f"--sampling '{self.sampling}': use one of {', '.join(SAMPLING)}.")
        if self.max_pool < 1 or self.block_size < 1:
            raise ValueError(f"--max-pool {self.max_pool} / --block-size {self.block_size}: both must be >= 1.")
        if not 1 <= self.num_negatives <= self.rank_end - self.rank_start:
            raise ValueError(f"--num-negatives {self.num_negatives}: need 1 to {self.rank_end - self.rank_start} (the "
                             "candidates --rank-window keeps per anchor).")
        if self.output_format not in OUTPUT_FORMATS:
            raise ValueError(f"--output-format '{self.output_format}': use one of {', '.join(OUTPUT_FORMATS)}.")

    def columns(self) -> tuple[str, ...]:
        """The header of the mined file: `sent0,sent1,hard_neg` (what `simcse_sup` reads), or for n-tuples
        `sent0,sent1,hard_neg_1,...,hard_neg_N`."""
        if self.output_format == "triplet":
            return MINED_COLUMNS
        return (*MINED_COLUMNS[:2], *(f"hard_neg_{i}" for i in range(1, self.num_negatives + 1)))


def parse_rank_window(text: str) -> tuple[int, int]:
    """`START:END` (END exclusive) as two ints; ValueError naming `--rank-window` otherwise."""
    start, sep, end = text.partition(":")
    if not sep or not start.strip().isdigit() or not end.strip().isdigit():
        raise ValueError(f"--rank-window '{text}': expected START:END with whole numbers, e.g. 0:30.")
    return int(start), int(end)


@dataclass(frozen=True)
class Pairs:
    """(anchor, positive) sentence pairs, stripped; `skipped` rows of `source` were left out (blank or low score).
    `mteb_datasets`: the MTEB datasets (task -> splits) the pairs are taken from, e.g. {"STSBenchmark": ["train"]}."""

    anchors: list[str]
    positives: list[str]
    source: str
    skipped: int = 0
    mteb_datasets: dict[str, list[str]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.anchors)


def read_table_pairs(path: Path, columns: Sequence[str]) -> Pairs:
    """Pairs from the two `columns` of a .csv or .tsv file with a header row; rows with a blank cell are skipped."""
    if not path.is_file():
        raise FileNotFoundError(f"--pairs '{path}' does not exist.")
    if path.suffix.lower() not in (".csv", ".tsv"):
        raise ValueError(f"--pairs '{path}': give a .csv or .tsv file with a header row, or 'stsb'.")
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle, delimiter="\t" if path.suffix.lower() == ".tsv" else ",")
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"--pairs '{path}' has no column(s) {missing} (--columns); it has {reader.fieldnames}.")
        rows = [(row[columns[0]] or "", row[columns[1]] or "") for row in reader]
    kept = [(a.strip(), p.strip()) for a, p in rows if a.strip() and p.strip()]
    return Pairs([a for a, _ in kept], [p for _, p in kept], str(path), len(rows) - len(kept))


def read_stsb_pairs(source: str, min_score: float, data_dir: str | os.PathLike | None = None) -> Pairs:
    """STS-B pairs scored at least `min_score` (0-5): `stsb` / `stsb:SPLIT` from the SentEval data directory, or a
    file in SentEval's `sts-*.csv` layout (tab-separated, score in column 5, sentences in 6 and 7)."""
    if source.split(":")[0] == STSB_PREFIX:
        split = source.partition(":")[2] or "train"
        if split not in ("train", "dev", "test"):
            raise ValueError(f"--pairs '{source}': the STS-B split is train, dev or test.")
        pairs, name = load_sts_task(data_dir, "STSBenchmark", split)[split], f"STS-B {split}"
        declared = {"STSBenchmark": [STSB_MTEB_SPLITS[split]]}
    else:
        if not Path(source).is_file():
            raise FileNotFoundError(f"--pairs '{source}' does not exist.")
        pairs, name, declared = read_stsbenchmark(Path(source)), source, {}
    keep = [i for i, score in enumerate(pairs.scores) if score >= min_score]
    anchors = [pairs.sentences1[i].strip() for i in keep]
    positives = [pairs.sentences2[i].strip() for i in keep]
    return Pairs(anchors, positives, f"{name} (score >= {min_score:g})", len(pairs) - len(keep), declared)


def read_pairs(
    source: str, columns: Sequence[str] = ("sent0", "sent1"), min_score: float | None = None,
    data_dir: str | os.PathLike | None = None, layout: str | None = None,
) -> Pairs:
    """The pairs `--pairs` names: `stsb[:SPLIT]` or a file in STS-B's layout (`layout='stsb'`, pairs scored at least
    `min_score`, default 4.0), else a .csv/.tsv table (`--columns`). Raises naming the option at fault when the
    file is missing, a column is absent or no pair is left."""
    layout = layout or ("stsb" if source.split(":")[0] == STSB_PREFIX else "table")
    path = Path(os.path.expandvars(source)).expanduser()
    if layout == "stsb":
        score = 4.0 if min_score is None else min_score
        pairs = read_stsb_pairs(source if source.split(":")[0] == STSB_PREFIX else str(path), score, data_dir)
    elif min_score is not None:
        raise ValueError(f"--min-score applies to STS-B pairs (--pairs stsb, or --format stsb), not to '{source}'.")
    else:
        pairs = read_table_pairs(path, columns)
    if len(pairs) == 0:
        raise ValueError(f"--pairs '{source}': no pairs to mine from ({pairs.skipped} rows left out: blank text or "
                         "a score below --min-score).")
    return pairs


def read_corpus(path: Path) -> list[str]:
    """The non-blank lines of a text file, stripped: one candidate sentence per line."""
    if not path.is_file():
        raise FileNotFoundError(f"--corpus '{path}' does not exist.")
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    sentences = [line for line in lines if line]
    if not sentences:
        raise ValueError(f"--corpus '{path}' has no sentences (one per line).")
    return sentences


def build_pool(pairs: Pairs, corpus: Sequence[str] = (), include_pairs: bool = True) -> list[str]:
    """The candidate sentences, stripped and deduplicated in first-seen order: the corpus, then (with
    `include_pairs`) the pairs' positives and anchors."""
    own = [*pairs.positives, *pairs.anchors] if include_pairs else []
    return list(dict.fromkeys(s.strip() for s in [*corpus, *own] if s.strip()))


def check_pool_size(size: int, limit: int) -> None:
    """Refuse a pool the exact search should not take: it holds every pool embedding in memory and scores every
    anchor against every sentence (time ~ anchors x pool)."""
    if size == 0:
        raise ValueError("The candidate pool is empty: give --corpus or pairs with text.")
    if size > limit:
        raise ValueError(
            f"The candidate pool has {size:,} sentences, above the exact search's limit of {limit:,} (--max-pool): "
            f"it keeps all {size:,} embeddings in memory (4 bytes x dimension each) and scores every anchor against "
            "each. Raise --max-pool if memory and time allow, or pass a smaller --corpus."
        )


def block_topk(
    queries: torch.Tensor, pool: torch.Tensor, k: int, block_size: int = DEFAULT_BLOCK_SIZE,
    query_block: int = QUERY_BLOCK, show_progress: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The `k` highest scores `queries @ pool.T` per row and their pool indices, best first, on the CPU.

    Exact, and memory-bounded: one (query_block x block_size) score matrix at a time, whose top-k is merged with the
    running top-k of the earlier pool blocks; the same result as `torch.topk` of the full matrix (up to the order of
    exact ties)."""
    k = min(k, len(pool))
    scores, indices = [], []
    for start in tqdm(range(0, len(queries), query_block), desc="Searching", disable=not show_progress, leave=False):
        rows = queries[start : start + query_block]
        best = rows.new_empty(len(rows), 0)
        best_index = torch.empty(len(rows), 0, dtype=torch.long, device=rows.device)
        for offset in range(0, len(pool), block_size):
            block = rows @ pool[offset : offset + block_size].T
            top, where = block.topk(min(k, block.shape[1]), dim=1)
            merged, order = torch.cat([best, top], dim=1).topk(min(k, best.shape[1] + top.shape[1]), dim=1)
            best, best_index = merged, torch.cat([best_index, where + offset], dim=1).gather(1, order)
        scores.append(best.float().cpu())
        indices.append(best_index.cpu())
    if not scores:  # no queries
        return torch.empty(0, k), torch.empty(0, k, dtype=torch.long)
    return torch.cat(scores), torch.cat(indices)


@dataclass
class MiningResult:
    """The mined rows (anchor, positive, negative...: `MiningSettings.columns`), and what happened to the pairs that
    gave none."""

    rows: list[tuple[str, ...]]
    pairs_in: int
    dropped: int
    pool_size: int
    skipped: dict[str, int] = field(default_factory=dict)  # candidates in the window removed by each margin


def text_keys(pool: Sequence[str], texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor, Counter]:
    """An id per distinct stripped text: the pool's ids, `texts`' ids (-1 where not in the pool), and how many pool
    entries share each id."""
    ids: dict[str, int] = {}
    pool_keys = [ids.setdefault(s.strip(), len(ids)) for s in pool]
    other = [ids.get(s.strip(), -1) for s in texts]
    return torch.tensor(pool_keys), torch.tensor(other), Counter(pool_keys)


def select_negatives(
    scores: torch.Tensor, excluded: torch.Tensor, positive_scores: torch.Tensor, settings: MiningSettings
) -> tuple[torch.Tensor, dict[str, int]]:
    """The columns of the `num_negatives` chosen candidates in each row of `scores` (ranked best first), -1 where
    fewer survive, and the number of in-window candidates each margin removed. See the module docstring."""
    kept = ~excluded
    rank = kept.cumsum(dim=1) - 1
    keep = kept & (rank >= settings.rank_start) & (rank < settings.rank_end)
    positive = positive_scores[:, None]
    skipped = {}
    if settings.absolute_margin is not None:  # sentence-transformers: scores + absolute_margin > positive
        too_close = keep & (scores + settings.absolute_margin > positive)
        skipped["absolute_margin"], keep = int(too_close.sum()), keep & ~too_close
    if settings.relative_margin is not None:  # sentence-transformers: scores > positive - |positive| * margin
        too_close = keep & (scores > positive - positive.abs() * settings.relative_margin)
        skipped["relative_margin"], keep = int(too_close.sum()), keep & ~too_close
    if settings.sampling == "top":  # the best-ranked survivors
        weight = torch.where(keep, -rank.float(), -math.inf)
    else:
        generator = torch.Generator().manual_seed(settings.seed)
        weight = torch.where(keep, torch.rand(keep.shape, generator=generator), -math.inf)
    values, choice = weight.topk(min(settings.num_negatives, weight.shape[1]), dim=1)
    choice[values == -math.inf] = -1
    return choice, skipped


def anchor_groups(anchors: Sequence[str]) -> list[list[int]]:
    """The rows of each distinct (stripped) anchor text, in first-seen order: a repeated anchor is one group."""
    groups: dict[str, list[int]] = {}
    for i, anchor in enumerate(anchors):
        groups.setdefault(anchor.strip(), []).append(i)
    return list(groups.values())


def mine_from_embeddings(
    anchors: torch.Tensor, positives: torch.Tensor, pool: torch.Tensor, pairs: Pairs, pool_texts: Sequence[str],
    settings: MiningSettings, show_progress: bool = False,
) -> MiningResult:
    """Mine with given embeddings (rows aligned with `pairs` and `pool_texts`; cosine, so any scale).

    Rows sharing an anchor text form a group, as in sentence-transformers: every row of the group excludes the
    group's anchor and ALL its positives from the candidates, and its margins compare with the group's smallest
    anchor-positive score."""
    check_pool_size(len(pool_texts), settings.max_pool)
    anchors, positives, pool = (F.normalize(t.float(), dim=-1) for t in (anchors, positives, pool))
    pool_keys, anchor_keys, counts = text_keys(pool_texts, pairs.anchors)
    positive_keys = text_keys(pool_texts, pairs.positives)[1]
    groups = anchor_groups(pairs.anchors)
    group_of = torch.empty(len(pairs), dtype=torch.long)
    for g, rows in enumerate(groups):
        group_of[rows] = g
    # the keys each group removes: its anchor's and every one of its positives' (-1: a text the pool lacks)
    removed = [{anchor_keys[rows[0]].item(), *positive_keys[rows].tolist()} - {-1} for rows in groups]
    # room for the candidates removed before ranking: every pool entry sharing one of those texts
    extra = max((sum(counts[k] for k in keys) for keys in removed), default=0)
    scores, indices = block_topk(anchors, pool, settings.rank_end + extra, settings.block_size,
                                 show_progress=show_progress)
    # a candidate is excluded when (its row's group, its text) is one of the (group, removed text) pairs
    width = len(counts) + 1
    removed_pairs = torch.tensor([g * width + k for g, keys in enumerate(removed) for k in keys], dtype=torch.long)
    excluded = torch.isin(group_of[:, None] * width + pool_keys[indices], removed_pairs)
    positive_scores = (anchors * positives).sum(dim=-1).float().cpu()
    # sentence-transformers: "use the _minimum_ positive score (i.e., harder positive) for the margin"
    group_scores = torch.full((len(groups),), math.inf).scatter_reduce(0, group_of, positive_scores, "amin")
    choice, skipped = select_negatives(scores, excluded, group_scores[group_of], settings)
    negatives = [[pool_texts[int(indices[i, c])] for c in row if c >= 0] for i, row in enumerate(choice.tolist())]
    if settings.output_format == "triplet":  # a row per negative
        rows = [(pairs.anchors[i], pairs.positives[i], n) for i, found in enumerate(negatives) for n in found]
        dropped = sum(not found for found in negatives)
    else:  # one row per pair, only with all its negatives (as sentence-transformers does)
        rows = [(pairs.anchors[i], pairs.positives[i], *found) for i, found in enumerate(negatives)
                if len(found) == settings.num_negatives]
        dropped = len(pairs) - len(rows)
    return MiningResult(rows, len(pairs), dropped, len(pool_texts), skipped)


def mine_hard_negatives(
    encoder, pairs: Pairs, pool_texts: Sequence[str], settings: MiningSettings, batch_size: int = 128,
    bf16: bool = False, show_progress: bool = False,
) -> MiningResult:
    """Encode the pool and the pairs with `encoder` (a `SentenceEncoder`, each distinct sentence once) and mine."""
    check_pool_size(len(pool_texts), settings.max_pool)  # before anything is encoded
    texts = list(dict.fromkeys([*pool_texts, *pairs.anchors, *pairs.positives]))
    row = {text: i for i, text in enumerate(texts)}
    embeddings = encoder.encode(
        texts, batch_size=batch_size, normalize=True, bf16=bf16, convert_to_numpy=False,
        show_progress_bar=show_progress,
    ).to(encoder.device)

    def rows(sentences: Sequence[str]) -> torch.Tensor:
        return embeddings[[row[s] for s in sentences]]

    return mine_from_embeddings(
        rows(pairs.anchors), rows(pairs.positives), rows(pool_texts), pairs, pool_texts, settings, show_progress
    )


def write_rows(path: Path, columns: Sequence[str], rows: Sequence[tuple[str, ...]]) -> None:
    """The mined rows as a CSV with the header `columns` (`MiningSettings.columns`) and `\n` line ends: the csv
    module's default `\r\n` would make every run on the file report its line ends as repaired."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(rows)
