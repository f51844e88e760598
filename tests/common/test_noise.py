"""What `setup_logging` keeps out of a command's output: lines that name nothing the user asked about (mteb's
`no_revision_available` note after every run's export, sentence-transformers' temporary paths, httpx's request lines
during a push, DeepSpeed's CPU fallback on a machine without a GPU), and Trainer's logs printed as numbers. Each
test makes the library emit its real record (or calls the function that does) after `setup_logging`."""

from __future__ import annotations

import ast
import logging
from types import SimpleNamespace

import pytest

from hf_sentcl.common.logs import setup_logging

#: loggers whose level or filters `setup_logging` changes; restored after each test
TOUCHED = ("", "hf_sentcl", "sentence_transformers", "httpx", "httpcore", "httpx2", "httpcore2", "DeepSpeed")


@pytest.fixture
def console(monkeypatch):
    """`setup_logging` as a command line runs it: on a root logger without handlers (pytest's capture handlers,
    which it adds for each test phase, set aside), so that it installs its console handler on the captured stderr.
    Every logger it touches is restored after the test."""
    saved = {name: logging.getLogger(name).level for name in TOUCHED}
    for name in TOUCHED:  # as in a fresh process, whatever an earlier test's setup_logging set
        monkeypatch.setattr(logging.getLogger(name), "filters", [])
        if name not in ("", "DeepSpeed"):  # DeepSpeed sets its own level (WARNING) when it loads
            logging.getLogger(name).setLevel(logging.NOTSET)

    def setup() -> None:
        monkeypatch.setattr(logging.getLogger(), "handlers", [])
        setup_logging()

    yield setup
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


class Records(logging.Handler):
    """Every record that reaches it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


# ------------------------------------------------------------------------------------------------------- 4a: mteb note
def unpushed_note_warning() -> None:
    """What `hf_sentcl.export.mteb_files.check_mteb_submission` logs for results filed under mteb's
    `no_revision_available` (every run's export before a push): its logger, its line, its note."""
    from hf_sentcl.evaluation.mteb import NO_REVISION
    from hf_sentcl.export.mteb_files import submission_notes

    (note,) = submission_notes(SimpleNamespace(revision=NO_REVISION, name="hf_sentcl/out"), "out/mteb_results")
    logging.getLogger("hf_sentcl").warning("MTEB results in %s: %s", f"out/mteb_results/{NO_REVISION}", note)


def test_the_unpushed_mteb_note_is_not_a_warning(console, capsys):
    console()
    unpushed_note_warning()
    logging.getLogger("hf_sentcl").warning("a warning of our own")
    err = capsys.readouterr().err
    assert "no_revision_available" not in err and "WARNING hf_sentcl: a warning of our own" in err


def test_the_unpushed_mteb_note_is_shown_once_at_debug(console, capsys):
    console()
    logging.getLogger("hf_sentcl").setLevel(logging.DEBUG)
    unpushed_note_warning()
    unpushed_note_warning()
    err = capsys.readouterr().err
    assert err.count("no_revision_available': MTEB's results repository") == 1
    assert "DEBUG hf_sentcl: MTEB results in" in err and "WARNING" not in err


# ------------------------------------------------------------------------------------------- 4b: sentence-transformers
def test_sentence_transformers_paths_are_not_logged(console, capsys, tiny_bert_dir, tmp_path):
    """`Saving model to .../.export.partial-...` and `Loading SentenceTransformer model from ...` (the export's
    check) are sentence-transformers' INFO lines: not shown; its warnings still are."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    console()
    backbone = Transformer(str(tiny_bert_dir))
    SentenceTransformer(modules=[backbone, Pooling(backbone.get_embedding_dimension())]).save(str(tmp_path / "st"))
    SentenceTransformer(str(tmp_path / "st"), device="cpu")
    err = capsys.readouterr().err
    assert "Saving model to" not in err and "SentenceTransformer model from" not in err, err
    assert logging.getLogger("sentence_transformers.base.model").isEnabledFor(logging.WARNING)


# ----------------------------------------------------------------------------------------------------------- 4c: httpx
def test_http_request_lines_are_not_logged(console, capsys):
    """huggingface_hub's client logs `HTTP Request: POST ...` at INFO for every request of a push."""
    import httpx2

    console()
    client = httpx2.Client(transport=httpx2.MockTransport(lambda request: httpx2.Response(200)))
    client.post("https://huggingface.co/api/repos/create")
    assert "HTTP Request" not in capsys.readouterr().err
    assert logging.getLogger("httpx2").isEnabledFor(logging.WARNING)


# ------------------------------------------------------------------------------------------------------- 4d: DeepSpeed
def accelerator_warnings(monkeypatch) -> list[str]:
    """DeepSpeed's warnings while it detects the accelerator afresh (as on its first import, which accelerate's
    `unwrap_model` triggers in every Trainer when deepspeed is installed)."""
    from deepspeed.accelerator import real_accelerator

    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    monkeypatch.setattr(real_accelerator, "ds_accelerator", None)
    records = Records()
    logger = logging.getLogger("DeepSpeed")
    logger.addHandler(records)
    try:
        real_accelerator.get_accelerator()
    finally:
        logger.removeHandler(records)
    return [r.getMessage() for r in records.records if r.levelno >= logging.WARNING]


def test_deepspeeds_cpu_fallback_is_quiet_without_a_gpu(console, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert any("Setting accelerator to CPU" in m for m in accelerator_warnings(monkeypatch))  # the library says it
    console()
    assert accelerator_warnings(monkeypatch) == []


def test_deepspeeds_cpu_fallback_still_warns_when_torch_sees_a_gpu(console, monkeypatch):
    """A GPU that torch sees but DeepSpeed could not detect is worth the warning: it is kept."""
    import torch

    console()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert any("Setting accelerator to CPU" in m for m in accelerator_warnings(monkeypatch))


# ---------------------------------------------------------------------------------------------------- 4e: Trainer logs
LOGS = {"loss": 1.32714, "grad_norm": 8.85812, "learning_rate": 0.001, "epoch": 0.5, "total_flos": 1.5e12, "step": 8}


def test_trainers_printer_quotes_numbers(capsys):
    """transformers 5's PrinterCallback (what Trainer prints its logs with when disable_tqdm is set) formats floats
    into strings: the reason for `trainer_log_line`."""
    from transformers.trainer_callback import PrinterCallback

    PrinterCallback().on_log(None, SimpleNamespace(is_local_process_zero=True), None, logs=dict(LOGS))
    assert "'loss': '1.327'" in capsys.readouterr().out


def test_trainer_log_line_prints_numbers():
    from hf_sentcl.common.logs import trainer_log_line

    line = trainer_log_line(dict(LOGS))
    assert line == "{'loss': 1.327, 'grad_norm': 8.858, 'learning_rate': 0.001, 'epoch': 0.5, 'step': 8}"
    assert ast.literal_eval(line)["loss"] == 1.327
    assert trainer_log_line({"eval_stsb_spearman": 0.812345, "eval_loss": float("nan")}) == (
        "{'eval_stsb_spearman': 0.8123, 'eval_loss': nan}")
