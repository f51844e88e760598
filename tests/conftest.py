"""Shared fixtures: offline environment, tiny random BERT/RoBERTa directories, a tiny SentEval layout."""

import atexit
import csv
import os
import shutil
import tempfile

# Offline, before anything imports huggingface_hub / transformers / datasets.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
if "HF_DATASETS_CACHE" not in os.environ:  # a private datasets cache for the session (and its subprocesses)
    os.environ["HF_DATASETS_CACHE"] = tempfile.mkdtemp(prefix="hf_sentcl_tests_datasets_")
    atexit.register(shutil.rmtree, os.environ["HF_DATASETS_CACHE"], ignore_errors=True)
# An empty Hub cache: nothing a test reads may come from the developer's cache (tests/test_hub_data.py builds its own).
_hub_home = tempfile.mkdtemp(prefix="hf_sentcl_tests_hub_")
os.environ["HF_HUB_CACHE"] = os.path.join(_hub_home, "hub")
os.environ["HF_ASSETS_CACHE"] = os.path.join(_hub_home, "assets")
atexit.register(shutil.rmtree, _hub_home, ignore_errors=True)

# imported after the cache settings above, which must be in place before datasets and huggingface_hub load
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import build_tiny_bert, build_tiny_roberta, random_sentences, write_full_senteval  # noqa: E402

# The models here are tiny: one intra-op thread is as fast as two on an idle machine and avoids OpenMP
# oversubscription stalls (10x slower steps) when the 2 cores are shared with other work.
torch.set_num_threads(1)

REPO_ROOT = Path(__file__).resolve().parents[1]
REAL_DATA = os.environ.get("HF_SENTCL_DATA")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    """A saved 2-layer random BERT (vocab = toy WordPiece) plus its tokenizer."""
    return build_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def tiny_roberta_dir(tmp_path_factory) -> Path:
    """A saved 2-layer random RoBERTa plus a tiny byte-level BPE tokenizer."""
    return build_tiny_roberta(tmp_path_factory.mktemp("tiny-roberta"))


@pytest.fixture(params=["bert", "roberta"])
def tiny_backbone_dir(request) -> Path:
    """Each test using this runs once on tiny BERT and once on tiny RoBERTa."""
    return request.getfixturevalue(f"tiny_{request.param}_dir")


@pytest.fixture(scope="session")
def senteval_dir(tmp_path_factory) -> Path:
    """A small SentEval-format directory holding all 7 STS tasks (read-only for tests)."""
    return write_full_senteval(tmp_path_factory.mktemp("senteval"))


@pytest.fixture(scope="session")
def real_data_dir() -> Path:
    """The real SentEval directory from HF_SENTCL_DATA; tests needing it are skipped without it."""
    if not REAL_DATA or not Path(REAL_DATA).is_dir():
        pytest.skip("HF_SENTCL_DATA is not set to the SentEval data directory")
    return Path(REAL_DATA)


@pytest.fixture
def train_files(tmp_path):
    text = tmp_path / "train.txt"
    text.write_text("\n".join(random_sentences(32, seed=3)) + "\n")
    triplets = tmp_path / "triplets.csv"
    rows = random_sentences(96, seed=4)
    with triplets.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["sent0", "sent1", "hard_neg"])
        writer.writerows(zip(rows[:32], rows[32:64], rows[64:]))
    nli = tmp_path / "nli.csv"
    with nli.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["premise", "hypothesis", "label"])
        writer.writerows((a, b, i % 3) for i, (a, b) in enumerate(zip(rows[:32], rows[32:64])))
    scored = tmp_path / "scored.csv"
    with scored.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["sent0", "sent1", "score"])
        writer.writerows((a, b, i % 6) for i, (a, b) in enumerate(zip(rows[:32], rows[32:64])))
    return {"text": text, "triplets": triplets, "nli": nli, "scored": scored}


@pytest.fixture
def export_dir(tiny_bert_dir, tmp_path) -> Path:
    """A real export of the tiny BERT (mean pooling; model card for the local folder, no repo id) with a .git folder,
    which a push never uploads (huggingface_hub's default ignores)."""
    from hf_sentcl import SentenceEncoder
    from hf_sentcl.export.bundle import export_with_card

    folder = tmp_path / "export"
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean").eval()
    export_with_card(encoder, folder, {}, verify=False)
    (folder / ".git").mkdir()
    (folder / ".git" / "HEAD").write_text("ref: refs/heads/main")
    return folder


#: the modules of the longest tests, longest first (2-core EPYC, two workers): launch chains of 100-170 s, resume
#: chains of about 115 s, inductor compiles of 35-70 s from a cold cache, launch-matrix cells of 30-60 s
LONGEST_FIRST = (
    "tests/pipeline/test_preemption.py",
    "tests/pipeline/test_scaling.py",
    "tests/modeling/test_compiled_layers.py",
    "tests/pipeline/test_launch_matrix.py",
)


def pytest_collection_modifyitems(config, items):
    """Longest tests first: `make test`'s two workers take tests from the front of the list and steal from its end,
    so the run ends on short tests instead of one worker alone in a 3-minute launch chain while the other idles (a
    fresh clone's run on a 2-core EPYC ended on about 3.5 minutes of one worker). The order within a module stays."""
    rank = {module: index for index, module in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.relative_to(config.rootpath).as_posix(), len(rank)))
