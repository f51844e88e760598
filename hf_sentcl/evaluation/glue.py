"""GLUE fine-tuning of an encoder's backbone: CLEAR's main evaluation (Wu et al. 2020, Tables 1 and 3).

    hf-sentcl glue --model PATH --tasks sst2,mrpc,stsb --output glue.json [--seeds 1,2,3]

For every task and seed a fresh copy of the backbone gets a classification (or, for STS-B, regression) head
(`AutoModelForSequenceClassification` from the backbone's weights, the head newly initialised), is fine-tuned on the
task's train split with transformers' `Trainer`, and is scored on the dev split with GLUE's metric (the caption of
CLEAR's Table 1): MNLI the mean of matched and mismatched accuracy, MRPC and QQP the mean of accuracy and F1, STS-B
the mean of Pearson and Spearman, CoLA Matthews correlation, the others accuracy; all x 100. Scores over seeds are
reported as mean ± sample std (ddof=1), as `hf-sentcl sweep` does.

Data (`--source`): `hub` reads `nyu-mll/glue` through `datasets` (online, every task); `senteval` (the default,
offline) reads the SentEval data directory's copies of three tasks:
- sst2: SST/binary/sentiment-{train,dev}: GLUE's SST-2 train (67,349 phrases) and dev (872) sets.
- stsb: STS/STSBenchmark/sts-{train,dev}.csv: GLUE's STS-B train (5,749) and dev (1,500) pairs.
- mrpc: MRPC/msr_paraphrase_{train,test}.txt has no dev split; GLUE's dev is 408 pairs taken out of the MSR train
  file by a list of ids that is not in SentEval's copy, so the dev set here is 408 pairs drawn from the train file
  with `MRPC_DEV_SEED` (the rest, 3,668 pairs, trains): the same sizes as GLUE's, not the same pairs.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from datasets import Dataset, load_dataset

from hf_sentcl.common.logs import watched
from hf_sentcl.common.stats import mean_pm_std, seed_stats
from hf_sentcl.common.tables import markdown_table
from hf_sentcl.evaluation.sts import read_lines, read_stsbenchmark
from hf_sentcl.hub.download import resolve_data_dir

GLUE_HUB_ID = "nyu-mll/glue"


GLUE_SOURCES = ("senteval", "hub")


#: tasks the SentEval data directory holds
SENTEVAL_GLUE_TASKS = ("sst2", "mrpc", "stsb")


MRPC_DEV_SIZE = 408


MRPC_DEV_SEED = 1234


# ------------------------------------------------------------------------------------------------ metrics
# scipy and scikit-learn are imported by the metric that uses them, not in every process's start (~0.6 s)
def accuracy(labels: np.ndarray, predictions: np.ndarray) -> dict[str, float]:
    from sklearn.metrics import accuracy_score

    return {"accuracy": 100 * float(accuracy_score(labels, predictions))}


def accuracy_and_f1(labels: np.ndarray, predictions: np.ndarray) -> dict[str, float]:
    """MRPC and QQP: accuracy, F1 of the positive class, and their mean (GLUE's score)."""
    from sklearn.metrics import accuracy_score, f1_score

    acc, f1 = 100 * float(accuracy_score(labels, predictions)), 100 * float(f1_score(labels, predictions))
    return {"accuracy": acc, "f1": f1, "score": (acc + f1) / 2}


def matthews(labels: np.ndarray, predictions: np.ndarray) -> dict[str, float]:
    """CoLA: Matthews correlation."""
    from sklearn.metrics import matthews_corrcoef

    return {"matthews": 100 * float(matthews_corrcoef(labels, predictions))}


def pearson_and_spearman(labels: np.ndarray, predictions: np.ndarray) -> dict[str, float]:
    """STS-B: Pearson and Spearman correlation and their mean (GLUE's score)."""
    from scipy.stats import pearsonr, spearmanr

    pearson = 100 * float(pearsonr(predictions, labels).statistic)
    spearman = 100 * float(spearmanr(predictions, labels).statistic)
    return {"pearson": pearson, "spearman": spearman, "score": (pearson + spearman) / 2}


@dataclass(frozen=True)
class GlueTask:
    """One GLUE task: its text columns, label count (1 = regression), metric, and dev split name(s) on the Hub."""

    name: str
    text_columns: tuple[str, ...]
    num_labels: int
    metric: Callable[[np.ndarray, np.ndarray], dict[str, float]]
    dev_splits: tuple[str, ...] = ("validation",)

    def score(self, labels: np.ndarray, predictions: np.ndarray) -> dict[str, float]:
        """GLUE's metrics of one dev split; 'score' is the task's single number."""
        metrics = self.metric(labels, predictions)
        metrics.setdefault("score", next(iter(metrics.values())))
        return metrics


GLUE_TASKS: dict[str, GlueTask] = {
    task.name: task
    for task in (
        GlueTask("cola", ("sentence",), 2, matthews),
        GlueTask("sst2", ("sentence",), 2, accuracy),
        GlueTask("mrpc", ("sentence1", "sentence2"), 2, accuracy_and_f1),
        GlueTask("qqp", ("question1", "question2"), 2, accuracy_and_f1),
        GlueTask("stsb", ("sentence1", "sentence2"), 1, pearson_and_spearman),
        GlueTask("mnli", ("premise", "hypothesis"), 3, accuracy, ("validation_matched", "validation_mismatched")),
        GlueTask("qnli", ("question", "sentence"), 2, accuracy),
        GlueTask("rte", ("sentence1", "sentence2"), 2, accuracy),
        GlueTask("wnli", ("sentence1", "sentence2"), 2, accuracy),
    )
}


# ------------------------------------------------------------------------------------------------ data
@dataclass
class GlueData:
    """A task's train split and its dev split(s) ({name: Dataset}), columns = the task's text columns + label."""

    train: Dataset
    dev: dict[str, Dataset]


def read_senteval_sst2(folder: Path, split: str) -> Dataset:
    """SST/binary/sentiment-<split>: 'phrase<TAB>label' lines."""
    rows = [line.rsplit("\t", 1) for line in read_lines(folder / f"sentiment-{split}", "GLUE") if line.strip()]
    return Dataset.from_dict({"sentence": [r[0].strip() for r in rows], "label": [int(r[1]) for r in rows]})


def read_senteval_mrpc(path: Path) -> Dataset:
    """MRPC/msr_paraphrase_*.txt: header, then quality, id1, id2, string1, string2."""
    rows = [line.split("\t") for line in read_lines(path, "GLUE", encoding="utf-8-sig")[1:] if line.strip()]
    return Dataset.from_dict(
        {"sentence1": [r[3] for r in rows], "sentence2": [r[4] for r in rows], "label": [int(r[0]) for r in rows]}
    )


def load_senteval_glue(data_dir: str | os.PathLike | None, task: str) -> GlueData:
    """The SentEval folder's copy of sst2, mrpc or stsb (see the module docstring for MRPC's dev split)."""
    root = resolve_data_dir(data_dir)
    if task == "sst2":
        folder = root / "SST" / "binary"
        return GlueData(read_senteval_sst2(folder, "train"), {"validation": read_senteval_sst2(folder, "dev")})
    if task == "stsb":
        def split(name: str) -> Dataset:
            pairs = read_stsbenchmark(root / "STS" / "STSBenchmark" / f"sts-{name}.csv")
            return Dataset.from_dict(
                {"sentence1": pairs.sentences1, "sentence2": pairs.sentences2, "label": pairs.scores.tolist()}
            )
        return GlueData(split("train"), {"validation": split("dev")})
    if task == "mrpc":
        pairs = read_senteval_mrpc(root / "MRPC" / "msr_paraphrase_train.txt")
        parts = pairs.train_test_split(test_size=MRPC_DEV_SIZE, seed=MRPC_DEV_SEED, shuffle=True)
        return GlueData(parts["train"], {"validation": parts["test"]})
    raise ValueError(
        f"GLUE task '{task}' is not in the SentEval data directory (it holds {', '.join(SENTEVAL_GLUE_TASKS)}); "
        "use --source hub for the others."
    )


def load_hub_glue(task: str) -> GlueData:
    """`nyu-mll/glue` through `datasets` (needs the network or a populated cache)."""
    spec = GLUE_TASKS[task]
    columns = [*spec.text_columns, "label"]
    train = load_dataset(GLUE_HUB_ID, task, split="train").select_columns(columns)
    dev = {name: load_dataset(GLUE_HUB_ID, task, split=name).select_columns(columns) for name in spec.dev_splits}
    return GlueData(train, dev)


def check_tasks(tasks: Sequence[str], source: str) -> None:
    """Raise ValueError naming an unknown task or source, or a task the source does not hold."""
    if source not in GLUE_SOURCES:
        raise ValueError(f"GLUE source must be one of {', '.join(GLUE_SOURCES)}, got '{source}'.")
    unknown = [t for t in tasks if t not in GLUE_TASKS]
    if unknown or not tasks:
        raise ValueError(f"unknown GLUE task(s) {unknown or tasks}; known: {', '.join(GLUE_TASKS)}.")
    missing = [t for t in tasks if source == "senteval" and t not in SENTEVAL_GLUE_TASKS]
    if missing:
        raise ValueError(
            f"GLUE task(s) {missing} are not in the SentEval data directory (it holds "
            f"{', '.join(SENTEVAL_GLUE_TASKS)}); use the 'hub' source (nyu-mll/glue, online) for them."
        )


# ------------------------------------------------------------------------------------------------ fine-tuning
@dataclass
class GlueSettings:
    """Fine-tuning settings shared by every task (BERT's GLUE recipe: lr 2e-5, batch 32, 3 epochs, 10% warm-up)."""

    tasks: tuple[str, ...] = SENTEVAL_GLUE_TASKS
    source: str = "senteval"
    seeds: tuple[int, ...] = (1,)
    epochs: float = 3.0
    learning_rate: float = 2e-5
    batch_size: int = 32
    max_seq_length: int = 128
    warmup_ratio: float = 0.1
    max_train_samples: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        check_tasks(self.tasks, self.source)
        if not self.seeds:
            raise ValueError("GLUE seeds are empty; give at least one seed.")
        for key in ("epochs", "learning_rate", "batch_size", "max_seq_length"):
            if getattr(self, key) <= 0:
                raise ValueError(f"GLUE {key} must be positive, got {getattr(self, key)}.")
        if self.max_train_samples is not None and self.max_train_samples < 1:
            raise ValueError(f"GLUE max_train_samples must be positive, got {self.max_train_samples}.")


class GlueEvaluator:
    """Fine-tune and score an encoder's backbone on GLUE tasks. All data is read here, before any model loads."""

    def __init__(self, data_dir: str | os.PathLike | None, settings: GlueSettings):
        settings.check()
        self.settings = settings
        self.data = {
            task: load_senteval_glue(data_dir, task) if settings.source == "senteval" else load_hub_glue(task)
            for task in settings.tasks
        }
        if settings.max_train_samples is not None:  # the first N, as max_train_samples everywhere
            for data in self.data.values():
                data.train = data.train.select(range(min(settings.max_train_samples, len(data.train))))

    def __call__(self, encoder, device: str | None = None) -> dict[str, dict[str, Any]]:
        """{task: {'score': {mean, std, values}, 'runs': [per-seed metrics]}} for a `SentenceEncoder` (its backbone
        and tokenizer are what is fine-tuned; the encoder itself is not changed)."""
        with tempfile.TemporaryDirectory(prefix="hf_sentcl_glue_") as folder:
            encoder.backbone.save_pretrained(folder)
            encoder.tokenizer.save_pretrained(folder)
            results = {}
            for task, data in self.data.items():
                runs = [self.fine_tune(folder, task, data, seed, device) for seed in self.settings.seeds]
                results[task] = {"score": seed_stats([r["score"] for r in runs]), "runs": runs,
                                 "train_examples": len(data.train)}
        return results

    def fine_tune(self, backbone_dir: str, task: str, data: GlueData, seed: int, device: str | None) -> dict:
        """One seed of one task: fine-tune a fresh copy with a new head, score it on the dev split(s)."""
        import torch
        from transformers import (
            AutoModelForSequenceClassification,
            AutoTokenizer,
            DataCollatorWithPadding,
            Trainer,
            TrainingArguments,
            set_seed,
        )

        spec, settings = GLUE_TASKS[task], self.settings
        set_seed(seed)  # the head's initialisation follows the seed
        tokenizer = AutoTokenizer.from_pretrained(backbone_dir)
        model = AutoModelForSequenceClassification.from_pretrained(
            backbone_dir, num_labels=spec.num_labels,
            problem_type="regression" if spec.num_labels == 1 else "single_label_classification",
        )

        def tokenize(dataset: Dataset) -> Dataset:
            def encode(batch):
                texts = [batch[c] for c in spec.text_columns]
                return tokenizer(*texts, truncation=True, max_length=settings.max_seq_length)

            columns = [c for c in dataset.column_names if c != "label"]
            return dataset.map(encode, batched=True, remove_columns=columns, desc=f"Tokenising {task}")

        use_cpu = device == "cpu" or not torch.cuda.is_available()
        with tempfile.TemporaryDirectory(prefix=f"hf_sentcl_glue_{task}_") as output_dir:
            args = TrainingArguments(
                output_dir=output_dir, num_train_epochs=settings.epochs, learning_rate=settings.learning_rate,
                per_device_train_batch_size=settings.batch_size, per_device_eval_batch_size=2 * settings.batch_size,
                warmup_steps=settings.warmup_ratio, weight_decay=0.01, seed=seed, data_seed=seed,
                eval_strategy="no", save_strategy="no", report_to="none", logging_strategy="no", use_cpu=use_cpu,
                disable_tqdm=not watched(), **settings.extra,
            )
            trainer = Trainer(
                model=model, args=args, train_dataset=tokenize(data.train),
                data_collator=DataCollatorWithPadding(tokenizer), processing_class=tokenizer,
            )
            train_output = trainer.train()
            per_split = {}
            for name, dev in data.dev.items():
                prediction = trainer.predict(tokenize(dev))
                logits = prediction.predictions
                predicted = logits.reshape(-1) if spec.num_labels == 1 else logits.argmax(axis=-1)
                per_split[name] = spec.score(np.asarray(dev["label"]), predicted)
        score = float(np.mean([m["score"] for m in per_split.values()]))  # MNLI: mean of matched and mismatched
        metrics = per_split["validation"] if len(per_split) == 1 else per_split
        return {"seed": seed, "score": score, "metrics": metrics, "train_loss": train_output.training_loss}


def glue_markdown_table(rows: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    """{label: GlueEvaluator output} -> a Markdown table of each task's dev score (mean ± std over seeds)."""
    tasks = list(dict.fromkeys(t for r in rows.values() for t in r))
    body = []
    for label, result in rows.items():
        cells = [mean_pm_std(result[t]["score"]) if t in result else "" for t in tasks]
        average = np.mean([result[t]["score"]["mean"] for t in tasks if t in result])
        body.append([label, *cells, f"{average:.2f}"])
    lines = markdown_table(["", *tasks, "Avg"], body)
    lines += ["", "GLUE dev scores x 100 after fine-tuning (CLEAR Table 1's metrics: MNLI mean of m/mm accuracy, MRPC "
              "and QQP mean of accuracy and F1, STS-B mean of Pearson and Spearman, CoLA Matthews, others accuracy); "
              "mean ± sample std over seeds."]
    return "\n".join(lines)
