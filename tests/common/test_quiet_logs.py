"""Readable logs: without a terminal on stderr (a log file, CI output) neither `encode` nor a training run draws
progress bars, so evaluation inside training leaves no nested bar and no cursor-up (`[A`) fragments."""

import io

import pytest
from helpers import random_sentences

from hf_sentcl import SentenceEncoder
from hf_sentcl.cli.train import main

BAR_MARKS = ("\r", "\x1b[A", "it/s]")


class Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_encode_draws_no_bar_without_a_terminal(tiny_bert_dir, capfd):
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean", head="none")
    capfd.readouterr()  # transformers' weight-loading bar is not ours
    encoder.encode(random_sentences(40, seed=1), batch_size=8)  # 5 batches: long enough for the automatic bar
    assert capfd.readouterr().err == ""


def test_encode_draws_a_bar_on_a_terminal(tiny_bert_dir, monkeypatch):
    """The automatic bar still appears for an interactive user (checks that the test above can fail)."""
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean", head="none")
    encoder.encode(random_sentences(40, seed=1), batch_size=8)
    assert "Encoding" in terminal.getvalue()


@pytest.fixture
def recipe(tmp_path, tiny_bert_dir, senteval_dir):
    corpus = tmp_path / "train.txt"
    corpus.write_text("\n".join(random_sentences(24, seed=3)) + "\n")
    values = {
        "method": "simcse", "model_name_or_path": tiny_bert_dir, "train_file": corpus, "sts_data_dir": senteval_dir,
        "output_dir": tmp_path / "out", "pooling": "mean", "head": "none", "per_device_train_batch_size": 4,
        "max_seq_length": 16, "eval_steps": 3, "save_steps": 3, "logging_steps": 2, "use_cpu": "true",
        # small encoding batches, so that the dev and final evaluations are long enough for the automatic bar
        "per_device_eval_batch_size": 2,
    }
    path = tmp_path / "recipe.yaml"
    path.write_text("".join(f"{key}: {value}\n" for key, value in values.items()))
    return path


@pytest.mark.slow
def test_training_run_log_has_no_bars(recipe, capfd):
    """A whole run (tokenising, dev evaluation every 3 steps inside training, final evaluation, export) writes no
    bar to a non-terminal stderr, and Trainer's logs arrive as printed lines."""
    assert main([str(recipe)]) == 0
    out, err = capfd.readouterr()
    assert not [mark for mark in BAR_MARKS if mark in err], err[-2000:]
    assert "'eval_stsb_spearman'" in out and "'loss'" in out
    assert "Sentence vectors in every row: `mean` pooling, no head." in out
