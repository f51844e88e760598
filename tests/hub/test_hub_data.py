"""Data from the Hub, offline against a real huggingface_hub cache built here: the SentEval archive (resolution
order, extraction once and atomically, damaged archives), hf:// training and NLI files, the prefetch CLI."""

import hashlib
import io
import os
import re
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest
from helpers import FakeEncoder, write_full_senteval
from huggingface_hub import constants

from hf_sentcl.cli.data import main as data_main
from hf_sentcl.cli.train import main as run_main
from hf_sentcl.configs import DataArguments
from hf_sentcl.data.corpus import load_training_dataset
from hf_sentcl.data.nli import load_nli_pairs, resolve_nli_source
from hf_sentcl.evaluation.sts import STSEvaluator
from hf_sentcl.hub import download as hub
from hf_sentcl.hub.download import SIMCSE_REPO, HubFile, resolve_data_dir, senteval_from_hub
from hf_sentcl.recipe.checks import validate_recipe
from hf_sentcl.recipe.parser import parse_recipe

REV1 = "1" * 40  # refs/main
REV2 = "2" * 40  # an older snapshot, reachable by its commit hash only
WIKI = f"hf://datasets/{SIMCSE_REPO}/wiki1m_for_simcse.txt"
NLI = f"hf://datasets/{SIMCSE_REPO}/nli_for_simcse.csv"
TRIPLETS = "sent0,sent1,hard_neg\na man sleeps,a person rests,a man runs\nkids play,children play,nobody plays\n"


def senteval_tar(source: Path, path: Path, wrap: str | None = None) -> Path:
    """A tar of the SentEval folder `source`: task folders at the top level, or inside one folder `wrap`."""
    with tarfile.open(path, "w") as tar:
        for child in sorted(source.iterdir()):
            tar.add(child, arcname=f"{wrap}/{child.name}" if wrap else child.name)
    return path


def add_snapshot(hub_cache: Path, revision: str, files: dict[str, bytes], main: bool = False) -> Path:
    """Put `files` into huggingface_hub's cache layout, as a download leaves them: the content in blobs/<sha256>,
    snapshots/<commit>/<file> a relative symlink to it, and refs/main holding the commit when `main`."""
    repo = hub_cache / f"datasets--{SIMCSE_REPO.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        blob = repo / "blobs" / hashlib.sha256(content).hexdigest()
        blob.write_bytes(content)
        pointer = snapshot / name
        pointer.parent.mkdir(parents=True, exist_ok=True)
        if pointer.is_symlink():
            pointer.unlink()
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    if main:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(revision)
    return snapshot


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    """An empty HF_HOME, offline; huggingface_hub reads its cache paths at import, so its constants move too."""
    home = tmp_path / "hf_home"
    for var, value in (("HF_HOME", home), ("HF_HUB_CACHE", home / "hub"), ("HF_ASSETS_CACHE", home / "assets")):
        monkeypatch.setenv(var, str(value))
        monkeypatch.setattr(constants, var, str(value))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.delenv("HF_SENTCL_DATA", raising=False)
    monkeypatch.setattr(hub, "_extracted", {})
    return home


@pytest.fixture(scope="module")
def senteval_files(tmp_path_factory):
    """The 7 STS tasks plus SentEval's SNLI dev/test files (consert_minilm_joint reads them)."""
    root = write_full_senteval(tmp_path_factory.mktemp("senteval-src"))
    (root / "SNLI").mkdir()
    for split in ("dev", "test"):
        for name, lines in (("s1", "A dog runs.\nA cat.\n"), ("s2", "An animal moves.\nNo cat.\n"),
                            ("labels", "entailment\ncontradiction\n")):
            (root / "SNLI" / f"{name}.{split}").write_text(lines)
    return root


@pytest.fixture
def hub_cache(hf_home, senteval_files, tmp_path):
    """The SimCSE data repository in the cache: REV1 on main (flat archive), REV2 by commit (wrapped archive)."""
    flat = senteval_tar(senteval_files, tmp_path / "flat.tar").read_bytes()
    wrapped = senteval_tar(senteval_files, tmp_path / "wrapped.tar", wrap="downstream").read_bytes()
    add_snapshot(hf_home / "hub", REV1, {
        "senteval.tar": flat, "wiki1m_for_simcse.txt": b"first sentence\n\nsecond sentence\nthird\n",
        "nli_for_simcse.csv": TRIPLETS.encode(),
        "nli/pairs.csv": b"premise,hypothesis,label\nA dog runs.,An animal moves.,entailment\nA cat.,No cat.,2\n",
    }, main=True)
    add_snapshot(hf_home / "hub", REV2, {"senteval.tar": wrapped, "wiki1m_for_simcse.txt": b"old corpus line\n"})
    return hf_home / "hub"


def same_tree(a: Path, b: Path) -> bool:
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    return files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file()) and all(
        (a / f).read_bytes() == (b / f).read_bytes() for f in files
    )


# ------------------------------------------------------------------------------------------- SentEval archive
def test_resolution_order(hub_cache, hf_home, senteval_files, tmp_path, monkeypatch):
    """--data-dir / sts_data_dir, then HF_SENTCL_DATA, then the Hub archive of main; a named folder that does not
    exist is an error, never a silent fall-back to the Hub."""
    other = write_full_senteval(tmp_path / "other", seed=5)
    monkeypatch.setenv("HF_SENTCL_DATA", str(other))
    assert resolve_data_dir(senteval_files) == senteval_files
    assert resolve_data_dir(None) == other
    monkeypatch.delenv("HF_SENTCL_DATA")
    from_hub = resolve_data_dir(None)
    assert from_hub == hf_home / "assets" / "hf_sentcl" / f"datasets--{SIMCSE_REPO.replace('/', '--')}" / REV1 / \
        "senteval"
    assert same_tree(from_hub, senteval_files)
    monkeypatch.setenv("HF_SENTCL_DATA", "")  # empty is unset
    assert resolve_data_dir("") == from_hub
    with pytest.raises(FileNotFoundError, match="nowhere"):
        resolve_data_dir(tmp_path / "nowhere")


def test_hub_data_scores_like_the_local_folder(hub_cache, senteval_files):
    """The evaluator reads the extracted archive exactly as the folder it was made from."""
    local = STSEvaluator(senteval_files)
    from_hub = STSEvaluator()
    sentences = {s for pairs in local.data.values() for p in pairs.values() for s in (*p.sentences1, *p.sentences2)}
    rng = np.random.default_rng(0)
    encoder = FakeEncoder({s: rng.normal(size=8) for s in sentences})
    assert from_hub(encoder) == local(encoder)


@pytest.mark.parametrize("revision, wrapped", [(None, False), (REV2, True)])
def test_flat_and_wrapped_archives(hub_cache, senteval_files, revision, wrapped):
    """Task folders at the archive's top level or inside one wrapping folder give the same data folder, one per
    revision."""
    archive = HubFile(SIMCSE_REPO, "senteval.tar", revision)
    folder = senteval_from_hub(archive)
    assert folder.parent.name == (revision or REV1) and same_tree(folder, senteval_files)
    assert resolve_data_dir(archive.uri) == folder  # an hf:// data dir pins the revision


def test_extracts_once(hub_cache, monkeypatch):
    """A second resolution (in this process or a new one) finds the extracted folder and does not extract again;
    concurrent resolutions extract once and all get the complete folder."""
    calls = []
    extract = tarfile.TarFile.extractall

    def counting(self, *args, **kwargs):
        calls.append(1)
        return extract(self, *args, **kwargs)

    monkeypatch.setattr(tarfile.TarFile, "extractall", counting)
    first = senteval_from_hub()
    marker = first / "STS" / "STSBenchmark" / "sts-test.csv"
    mtime = marker.stat().st_mtime_ns
    monkeypatch.setattr(hub, "_extracted", {})  # as a new process would start
    assert senteval_from_hub() == first and len(calls) == 1 and marker.stat().st_mtime_ns == mtime

    archive = HubFile(SIMCSE_REPO, "senteval.tar", REV2)
    results, errors = [], []

    def resolve():
        try:
            results.append(senteval_from_hub(archive))
        except Exception as err:  # noqa: BLE001 - reported by the assertion below
            errors.append(err)

    threads = [threading.Thread(target=resolve) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(set(results)) == 1 and len(calls) == 2
    assert not list(results[0].parent.glob("*.incomplete"))


@pytest.mark.parametrize("damage", ["truncated", "not a tar"])
def test_damaged_archive_leaves_nothing(hf_home, senteval_files, tmp_path, damage):
    """A truncated or non-tar archive: an error naming it and telling how to fetch it again; no extracted folder
    and no temporary folder remain."""
    big = senteval_files.parent / "with-big-file"
    if not big.exists():
        write_full_senteval(big)
        (big / "MR").mkdir()
        (big / "MR" / "rt-polarity.pos").write_text("a fine film .\n" * 20_000)
    data = senteval_tar(big, tmp_path / "full.tar").read_bytes()
    data = data[: len(data) // 2] if damage == "truncated" else b"<html>proxy error page</html>"
    add_snapshot(hf_home / "hub", REV1, {"senteval.tar": data}, main=True)
    with pytest.raises(FileNotFoundError, match=r"senteval\.tar.*(truncated or damaged).*download --what senteval"):
        resolve_data_dir(None)
    parent = hf_home / "assets" / "hf_sentcl" / f"datasets--{SIMCSE_REPO.replace('/', '--')}" / REV1
    assert [p.name for p in parent.iterdir() if not p.name.endswith(".lock")] == []


def test_archive_without_senteval_layout(hf_home, tmp_path):
    """An archive that is not SentEval data is refused, saying what it holds; nothing stays behind."""
    with tarfile.open(tmp_path / "x.tar", "w") as tar:
        info = tarfile.TarInfo("README.md")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"hello"))
    add_snapshot(hf_home / "hub", REV1, {"senteval.tar": (tmp_path / "x.tar").read_bytes()}, main=True)
    with pytest.raises(FileNotFoundError, match=r"neither the SentEval task folders.*README\.md"):
        senteval_from_hub()
    assert not any(p for p in (hf_home / "assets").rglob("*") if p.is_dir() and p.name.startswith(".senteval"))


def test_offline_and_uncached_names_the_three_ways(hf_home):
    with pytest.raises(FileNotFoundError) as err:
        resolve_data_dir(None)
    message = str(err.value)
    for way in ("--data-dir", "sts_data_dir", "HF_SENTCL_DATA", "senteval.tar", "download --what senteval",
                "HF_HUB_OFFLINE"):
        assert way in message


def test_evaluate_cli_offline_uncached_exits_2(hf_home, tmp_path, capsys):
    """The evaluator stops before loading any model (the model path does not even exist)."""
    from hf_sentcl.cli.evaluate import main as evaluate_main

    assert evaluate_main(["--model", str(tmp_path / "no-model")]) == 2
    assert "HF_SENTCL_DATA" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------- hf:// files
def test_hf_train_file_with_and_without_revision(hub_cache):
    """main's corpus (blank lines dropped), then the older snapshot by commit."""
    latest = load_training_dataset(DataArguments(train_file=WIKI), ("text",))
    assert latest["text"] == ["first sentence", "second sentence", "third"]
    pinned = WIKI.replace("datasets-for-simcse/", f"datasets-for-simcse@{REV2}/")
    assert load_training_dataset(DataArguments(train_file=pinned), ("text",))["text"] == ["old corpus line"]


def test_supervised_csv_columns(hub_cache):
    triplets = load_training_dataset(DataArguments(train_file=NLI), ("sent0", "sent1", "hard_neg"))
    assert triplets.column_names == ["sent0", "sent1", "hard_neg"]
    assert triplets[1] == {"sent0": "kids play", "sent1": "children play", "hard_neg": "nobody plays"}


def test_hf_nli_source(hub_cache):
    """An NLI table on the Hub (nested path) loads with labels mapped; nli_splits do not apply to a file."""
    pairs = load_nli_pairs(resolve_nli_source(f"hf://datasets/{SIMCSE_REPO}/nli/pairs.csv"))
    assert pairs["premise"] == ["A dog runs.", "A cat."] and pairs["label"] == [0, 2]
    with pytest.raises(ValueError, match="nli_splits"):
        resolve_nli_source(f"hf://datasets/{SIMCSE_REPO}/nli/pairs.csv", ["train"])


@pytest.mark.parametrize("uri, message", [
    (f"hf://datasets/{SIMCSE_REPO}/missing.txt", r"missing\.txt.*not in the Hugging Face cache.*HF_HUB_OFFLINE"),
    (f"hf://datasets/{SIMCSE_REPO}@{'9' * 40}/wiki1m_for_simcse.txt", "not in the Hugging Face cache"),
    ("hf://models/org/model/file.txt", "only dataset files"),
    ("hf://datasets/justone", "names no file"),
])
def test_unavailable_hf_train_file_stops_the_run(hub_cache, tmp_path, capsys, tiny_bert_dir, uri, message):
    """Before any model loads: exit 2, the URI named."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"method: simcse\nmodel_name_or_path: {tiny_bert_dir}\ntrain_file: {uri}\n"
                      f"output_dir: {tmp_path / 'out'}\n")
    assert run_main([str(recipe)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: train_file") and re.search(message, err)


@pytest.mark.slow
def test_shipped_recipes_validate_offline_from_the_hub_cache(hub_cache, repo_root, monkeypatch):
    """Every recipe's data resolves from the Hub cache alone (no HF_SENTCL_DATA, no ../shared), and none names
    a relative or ${HF_SENTCL_DATA} path; consert's supervised stages name `datasets` ids (not checked here).
    The backbones (bert-base-uncased, ...) are not in this cache and its corpus is three lines: the backbone and
    batch-size checks have their own tests."""
    monkeypatch.setattr("hf_sentcl.recipe.checks.check_backbone", lambda recipe: None)
    monkeypatch.setattr("hf_sentcl.recipe.checks.count_train_examples", lambda path: 10**6)
    for path in sorted((repo_root / "recipes").glob("*.yaml")):
        text = path.read_text()
        assert "HF_SENTCL_DATA}" not in text and "wiki1m_subset" not in text, path.name
        recipe = parse_recipe(path, ["--output_dir", "/tmp/unused"])
        files = recipe.data.train_file if isinstance(recipe.data.train_file, list) else [recipe.data.train_file]
        for entry in filter(None, files):  # a list entry is a path or a mapping with its path
            assert (entry["path"] if isinstance(entry, dict) else entry).startswith("hf://datasets/"), path.name
        validate_recipe(recipe)


# -------------------------------------------------------------------------------------------------- the CLI
def test_info_and_download_in_process(hub_cache, hf_home, capsys, monkeypatch, senteval_files):
    """info says where each source is read from and downloads nothing; download (offline, all cached) extracts
    and prints the paths; an uncached source is an error with exit 2."""
    assert data_main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"read from: cache {hub_cache}" in out and "extracted on first use into" in out
    assert not any((hf_home / "assets").rglob("STS"))
    monkeypatch.setenv("HF_SENTCL_DATA", str(senteval_files))
    assert data_main(["info", "--what", "senteval"]) == 0
    assert f"read from: {senteval_files} (HF_SENTCL_DATA)" in capsys.readouterr().out

    assert data_main(["download"]) == 0
    out = capsys.readouterr().out
    extracted = hub.extraction_dir(hub.SENTEVAL_ARCHIVE, REV1)
    assert f"extracted: {extracted}" in out and same_tree(extracted, senteval_files)
    assert str(hub_cache / f"datasets--{SIMCSE_REPO.replace('/', '--')}" / "snapshots" / REV1 / "nli_for_simcse.csv") \
        in out
    assert data_main(["download", "--what", "senteval", "--revision", "9" * 40]) == 2
    assert "No SentEval data" in capsys.readouterr().err
    assert data_main(["download", "--what", "wikipedia"]) == 2
    assert "unknown source 'wikipedia'" in capsys.readouterr().err


@pytest.mark.slow
def test_module_entry_point_offline(hub_cache, hf_home):
    """`hf-sentcl data info/download` in a fresh process reads the cache named by the environment."""
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_CACHE": str(hub_cache),
           "HF_ASSETS_CACHE": str(hf_home / "assets"), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_SENTCL_DATA", None)

    def data_cli(*argv):
        return subprocess.run([sys.executable, "-m", "hf_sentcl", "data", *argv], env=env, capture_output=True,
                              text=True)

    done = data_cli("download", "--what", f"senteval,{WIKI}")
    assert done.returncode == 0, done.stderr
    assert f"extracted: {hub.extraction_dir(hub.SENTEVAL_ARCHIVE, REV1)}" in done.stdout
    shown = data_cli("info", "--what", "senteval,nli")
    assert shown.returncode == 0 and "extracted at" in shown.stdout and "nli_for_simcse.csv (revision" in shown.stdout
    assert data_cli("--help").returncode == 0


def test_info_offline_and_uncached(hf_home, capsys):
    """Nothing cached and offline: info says the source is unavailable and how to fetch it, and creates nothing."""
    assert data_main(["info", "--what", "wiki1m,senteval"]) == 0
    out = capsys.readouterr().out
    assert out.count("unavailable") == 2 and "download --what wiki1m" in out
    assert not hf_home.exists()
