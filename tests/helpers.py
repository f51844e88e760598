"""Builders shared by the tests: tiny random backbones with toy tokenizers, SentEval-format files, a fake encoder.

Everything here is offline and deterministic; `conftest.py` wraps the expensive pieces in session fixtures.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import set_seed

from hf_sentcl.evaluation import transfer
from hf_sentcl.evaluation.glue import MRPC_DEV_SIZE
from hf_sentcl.pipeline.train import build_stage
from hf_sentcl.recipe.parser import parse_recipe
from hf_sentcl.recipe.plan import plan_run
from hf_sentcl.registry import METHODS

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


def write_wordnet(root: Path) -> Path:
    """Write index.*, data.* and *.exc in the WordNet 3.0 format; each synset line starts with its byte offset."""
    root.mkdir(parents=True, exist_ok=True)
    for pos, name in NAMES.items():
        data, offsets = LICENSE, {}
        for key, (words, gloss) in SYNSETS[pos].items():
            offsets[key] = len(data.encode())
            listed = " ".join(f"{w} {i % 16:x}" for i, w in enumerate(words))
            data += f"{offsets[key]:08d} 05 {pos} {len(words):02x} {listed} 000 | {gloss}  \n"
        (root / f"data.{name}").write_text(data)
        index = LICENSE + "".join(
            f"{lemma} {pos} {len(keys)} 1 @ {len(keys)} 0 {' '.join(f'{offsets[k]:08d}' for k in keys)}  \n"
            for lemma, keys in sorted(INDEX[pos].items())
        )
        (root / f"index.{name}").write_text(index)
        (root / f"{name}.exc").write_text(EXCEPTIONS[pos])
    return root


def gradients(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def step(trainer, inputs, mini_batch_size, seed=7):
    """One `training_step` from a fresh copy of the weights and RNG seed; returns (loss, gradients)."""
    trainer.args.mini_batch_size = mini_batch_size
    trainer.model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = trainer.training_step(trainer.model, inputs)
    return loss.detach(), gradients(trainer.model)


def reference_step(trainer, inputs, size, seed=7):
    """The plain large-batch step with the random draws the cached step makes (dropout masks, a method's augmentations):
    the mini-batches of `size` encoded one after the other WITH autograd (all activations kept), then one loss and one
    backward over the whole batch; returns (loss, gradients)."""
    from hf_sentcl.trainers.cached import split_batch

    model = trainer.model
    model.zero_grad(set_to_none=True)
    model.train()
    torch.manual_seed(seed)
    views = torch.cat([trainer.forward_views(model, chunk).views for chunk in split_batch(inputs, size)], dim=1)
    loss, _ = trainer.batch_loss(model, views, inputs)
    loss.backward()
    return loss.detach(), gradients(model)


def loss_with_fixed_draws(trainer, model, metric: str | None = None, seed: int = 0) -> float:
    """The trainer's loss on all its training examples as one batch with the random draws of `seed` (dropout masks,
    SG's sampled layers), or with `metric` that component of it as the trainer records it (SG's `contrastive_loss`).
    Compared before and after training it shows what the weights learned; the logged losses of a few tiny steps
    mostly show the luck of their draws."""
    recorded = {}
    if metric:
        trainer.record_metrics = recorded.update
    try:
        batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(trainer.train_dataset))])
        model.train()
        torch.manual_seed(seed)
        with torch.no_grad():
            loss = trainer.compute_loss(model, batch)
    finally:
        if metric:
            del trainer.record_metrics
    return float(recorded[metric] if metric else loss)


def assert_same(first, second, atol=1e-5, relative=1e-3):
    """Equal losses and gradients: max |difference| below `atol`, and below `relative` x the largest gradient."""
    (loss_a, grads_a), (loss_b, grads_b) = first, second
    assert torch.allclose(loss_a, loss_b, atol=atol, rtol=0), (loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) > 10
    worst = max((grads_a[k] - grads_b[k]).abs().max().item() for k in grads_a)
    largest = max(g.abs().max().item() for g in grads_a.values())
    print(f"loss {loss_a.item():.6f} vs {loss_b.item():.6f}; max |grad diff| {worst:.2e}, largest |grad| {largest:.2e}")
    assert worst < atol and worst < relative * largest, (worst, largest)


def write_snli(folder, split, n=6, seed=0, labels=None):
    """A SentEval-format SNLI split: s1.<split>, s2.<split>, labels.<split> (with SentEval's trailing spaces)."""
    folder.mkdir(parents=True, exist_ok=True)
    sentences = random_sentences(2 * n, seed=seed)
    labels = labels or (LABELS * n)[:n]
    (folder / f"s1.{split}").write_text("".join(f"{s} . \n" for s in sentences[:n]))
    (folder / f"s2.{split}").write_text("".join(f"{s} . \n" for s in sentences[n:]))
    (folder / f"labels.{split}").write_text("".join(f"{label}\n" for label in labels))
    return sentences


def write_recipe(tmp_path, **values):
    lines = []
    for key, value in values.items():
        if isinstance(value, bool):
            value = str(value).lower()
        elif isinstance(value, list):
            value = "[" + ", ".join(value) + "]"
        lines.append(f"{key}: {value}")
    path = tmp_path / "recipe.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


#: a tiny SimCSE run on one CPU, what the run-level tests (signals, job script, nodes, progress) start from
TINY_SIMCSE = {
    "method": "simcse", "global_train_batch_size": 4, "max_seq_length": 16, "max_steps": 8, "save_steps": 4,
    "eval_steps": 4, "logging_steps": 1, "learning_rate": "1e-3", "use_cpu": "true", "seed": 0,
    "eval_before_training": "false", "eval_tasks": "[sts]",
}


def tiny_simcse_recipe(folder: Path, model_dir: Path, senteval_dir: Path, *, corpus_lines: int = 64,
                       corpus_seed: int = 7, **changes) -> Path:
    """`folder/recipe.yaml`: `TINY_SIMCSE` on `model_dir`, a corpus of random sentences and the SentEval layout
    `senteval_dir`, with `changes` over it."""
    corpus = folder / "train.txt"
    corpus.write_text("\n".join(random_sentences(corpus_lines, seed=corpus_seed)) + "\n")
    values = {**TINY_SIMCSE, "model_name_or_path": model_dir, "train_file": corpus, "sts_data_dir": senteval_dir,
              **changes}
    path = folder / "recipe.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in values.items()))
    return path


def write_tiny_glue(root, n=48):
    """SST/binary, MRPC and STSBenchmark files in SentEval's formats; SST labels follow the first word (learnable)."""
    sentences = random_sentences(3 * n, seed=11)
    folder = root / "SST" / "binary"
    folder.mkdir(parents=True)
    for split, part in (("train", sentences[:n]), ("dev", sentences[n: n + 16])):
        (folder / f"sentiment-{split}").write_text(
            "".join(f"{'happy' if i % 2 else 'sad'} {s} \t{i % 2}\n" for i, s in enumerate(part)))
    (root / "MRPC").mkdir()
    k = len(sentences)
    rows = [f"{i % 2}\t{i}\t{i + 1}\t{sentences[i % k]}\t{sentences[(i + 1) % k]}" for i in range(MRPC_DEV_SIZE + 20)]
    (root / "MRPC" / "msr_paraphrase_train.txt").write_text("\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
                                                            + "\n".join(rows) + "\n")
    (root / "STS" / "STSBenchmark").mkdir(parents=True)
    for split in ("train", "dev"):
        (root / "STS" / "STSBenchmark" / f"sts-{split}.csv").write_text("".join(
            f"g\tf\ty\t{i}\t{i % 6:.1f}\t{sentences[i]}\t{sentences[-i - 1]}\n" for i in range(24)))
        declare_size(root / "STS" / "STSBenchmark" / f"sts-{split}.csv", 24)
    return root


# ------------------------------------------------------------------------------------------------ a tiny layout
def write_transfer_tasks(root, per_class: int = 12, seed: int = 0):
    """All 7 transfer tasks in SentEval's layout, formats and encodings, with `per_class` sentences per class
    (TREC and MRPC train sets too) built from the tiny models' vocabulary."""
    sentences = iter(random_sentences(40 * per_class + 200, seed=seed))
    take = lambda n: [next(sentences) for _ in range(n)]  # noqa: E731
    for folder, pos, neg in (("MR", "rt-polarity.pos", "rt-polarity.neg"), ("CR", "custrev.pos", "custrev.neg"),
                             ("SUBJ", "subj.objective", "subj.subjective"), ("MPQA", "mpqa.pos", "mpqa.neg")):
        (root / folder).mkdir(parents=True, exist_ok=True)
        for name in (pos, neg):
            (root / folder / name).write_bytes("".join(f"{s} \n" for s in take(per_class)).encode("latin-1"))
    sst = root / "SST" / "binary"
    sst.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", per_class), ("dev", 3), ("test", 3)):
        rows = [f"{s} \t{label}\n" for label in (0, 1) for s in take(n)]
        (sst / f"sentiment-{split}").write_text("".join(rows), encoding="utf-8")
    (root / "TREC").mkdir(exist_ok=True)
    for name, n in (("train_5500.label", per_class), ("TREC_10.label", 2)):
        rows = [f"{c}:other {s} ?\n" for c in TREC_CLASSES for s in take(n)]
        (root / "TREC" / name).write_bytes("".join(rows).encode("latin-1"))
    (root / "MRPC").mkdir(exist_ok=True)
    for split, n in (("train", per_class), ("test", 4)):
        rows = ["\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"]
        rows += [f"{label}\t{i}\t{i + 1}\t{a}\t{b}\n" for label in (0, 1) for i, (a, b) in
                 enumerate(zip(take(n), take(n)))]
        (root / "MRPC" / f"msr_paraphrase_{split}.txt").write_text("".join(rows), encoding="utf-8")
    declare_sizes(root)
    return root


EXCEPTIONS = {"n": "geese goose\nchildren child\n", "v": "ran run\n", "a": "faster fast\n", "r": ""}


INDEX = {  # lemma -> synset keys, most frequent sense first
    "n": {"car": ["car", "railcar"], "auto": ["car"], "automobile": ["car"], "goose": ["goose"],
          "child": ["child"], "kid": ["child"], "ford": ["ford"], "railcar": ["railcar"]},
    "v": {"run": ["run"], "drive": ["drive"]},
    "a": {"fast": ["fast"], "speedy": ["fast"]},
    "r": {"quickly": ["quickly"], "rapidly": ["quickly"]},
}


LABELS = ["entailment", "neutral", "contradiction", "neutral", "entailment", "contradiction"]


LICENSE = "  1 This software and database is being provided to you, the LICENSEE, by\n  2 Princeton University\n"


NAMES = {"n": "noun", "v": "verb", "a": "adj", "r": "adv"}


SYNSETS = {
    "n": {
        "car": (["car", "auto", "automobile", "machine", "motorcar"], "a motor vehicle"),
        "railcar": (["car", "railcar", "railway_car"], "a wheeled vehicle adapted to the rails"),
        "goose": (["goose"], "web-footed long-necked bird"),
        "child": (["child", "kid", "youngster"], "a young person"),
        "ford": (["Ford", "Henry_Ford"], "an industrialist"),
    },
    "v": {"run": (["run", "scat", "scamper"], "move fast by using one's feet"), "drive": (["drive"], "operate")},
    "a": {"fast": (["fast(a)", "speedy"], "acting or moving quickly")},
    "r": {"quickly": (["quickly", "rapidly", "speedily"], "with rapid movements")},
}


TREC_CLASSES = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")


def declare_sizes(root):
    """sizes.json in each task folder with its files' row counts (the readers check them instead of SentEval's)."""
    for folder in {(root / name).parent for names in transfer.TRANSFER_FILES.values() for name in names}:
        rows = {p.name: len(p.read_bytes().splitlines()) - p.name.startswith("msr_") for p in folder.iterdir()
                if p.is_file() and p.name != "sizes.json"}
        (folder / "sizes.json").write_text(json.dumps(rows))


def snapshot(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def changed_keys(before, module):
    return {k for k, v in module.state_dict().items() if k in before and not torch.equal(v, before[k])}


SENTENCES = [
    "the big red dog plays with a blue ball in the park and the cat runs",
    "a man sings",
    "the happy girl eats food with a kid on the street",
]


def batch_of(encoder, sentences=SENTENCES):
    return encoder.tokenizer(sentences, padding=True, return_tensors="pt")


#: recipe keys of the methods' runs in the per-method tests (fp16, host syncs), beyond the common ones in
#: `recipe_values`: the variants worth a run of their own, then every other registered method with its defaults
METHOD_VARIANTS = {
    "simcse": dict(method="simcse"),
    "simcse_sup": dict(method="simcse_sup"),
    "sg": dict(method="self_guided", objective="sg", pooling="cls", head="none"),
    "sg-opt": dict(method="self_guided", objective="sg-opt", pooling="cls", head="none"),
    "consert_joint_fgv": dict(method="consert", supervised_mode="joint", adversarial=True,
                              pooling="mean", head="none"),
    "clear": dict(method="clear", augmentation="del_word", pooling="cls", head="none"),
    "ifm": dict(method="simcse", perturbation="p-n+", margin=0.1, multi_task=True),
    "byop": dict(method="consert", perturbation="p+", margin=0.1, pooling="mean", head="none"),
    "cached": dict(method="simcse", mini_batch_size=4),
    "clear_cached": dict(method="clear", augmentation="del_word", pooling="cls", head="none", mini_batch_size=4),
    "angle": dict(method="angle", cosine_weight=0.5, angle_weight=0.3),  # every term on
    "esimcse": dict(method="esimcse", queue_size=16),  # the queue fills within the test's steps
    "esimcse_cached": dict(method="esimcse", queue_size=16, mini_batch_size=3),
    "promptbert": dict(method="promptbert", pooling="prompt", head="none"),  # the [MASK] state, no head (required)
}
METHOD_SETTINGS = {**METHOD_VARIANTS, **{name: dict(method=name) for name in METHODS
                                         if name not in {v["method"] for v in METHOD_VARIANTS.values()}}}


def recipe_values(name, model_dir, data_dir, out_dir, files, **overrides):
    values = dict(
        model_name_or_path=str(model_dir), sts_data_dir=str(data_dir), output_dir=str(out_dir),
        per_device_train_batch_size=8, learning_rate=1e-4, max_steps=3, eval_strategy="no", save_strategy="no",
        load_best_model_at_end=False, logging_steps=1, report_to="none", use_cpu=True, disable_tqdm=True,
        seed=0, max_seq_length=32, fp16=True, warmup_steps=0,
    )
    values.update(METHOD_SETTINGS[name])
    spec = METHODS[values["method"]]
    if spec.score_column:
        values["train_file"] = str(files["scored"])
    elif spec.text_columns != ("text",):  # pairs, with hard negatives where the method reads them
        values["train_file"] = str(files["triplets"])
    elif values.get("supervised_mode") == "joint":
        values["nli_source"] = str(files["nli"])
    else:
        values["train_file"] = str(files["text"])
    values.update(overrides)
    return values


def build_trainer(tmp_path, name, tiny_bert_dir, senteval_dir, files, **overrides):
    """The method's trainer as a run builds it, seeded first as `run_stage` does: the weights a method initialises
    (SimCSE's head) do not depend on what earlier tests drew from torch's generator."""
    recipe = parse_recipe(None, (), **recipe_values(name, tiny_bert_dir, senteval_dir, tmp_path / name, files,
                                                    **overrides))
    set_seed(recipe.training.seed)
    return build_stage(plan_run(recipe)).trainer


class DtypeProbe:
    """Records the dtype of every cross-entropy's (and logsumexp's) logits, and of the first encoder layer's query
    projection's output."""

    def __init__(self, monkeypatch, trainer):
        self.logits: list[torch.dtype] = []
        self.linear: list[torch.dtype] = []
        original = F.cross_entropy

        def cross_entropy(logits, *args, **kwargs):
            self.logits.append(logits.dtype)
            return original(logits, *args, **kwargs)

        def logsumexp(logits, *args, **kwargs):  # SG-OPT's loss is written with logsumexp, not cross_entropy
            self.logits.append(logits.dtype)
            return original_lse(logits, *args, **kwargs)

        original_lse = torch.logsumexp
        monkeypatch.setattr(F, "cross_entropy", cross_entropy)
        monkeypatch.setattr(torch, "logsumexp", logsumexp)
        query = next(m for n, m in trainer.model.named_modules() if n.endswith("layer.0.attention.self.query"))
        query.register_forward_hook(lambda module, args, output: self.linear.append(output.dtype))


def write_yaml_recipe(tmp_path, name="recipe.yaml", **values):
    """A recipe file of `values` (booleans and lists written as YAML)."""
    path = tmp_path / name
    lines = []
    for key, value in values.items():
        if isinstance(value, bool):
            value = str(value).lower()
        elif isinstance(value, list):
            value = "[" + ", ".join(map(str, value)) + "]"
        lines.append(f"{key}: {value}")
    path.write_text("\n".join(lines) + "\n")
    return path
