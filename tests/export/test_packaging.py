"""A plain (non-editable) install carries everything the package reads at run time: the wheel holds the card
template, and `hf-sentcl export` run from that install, outside the checkout, writes a model card."""

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

TEMPLATE = "hf_sentcl/model_cards/sentence_encoder.md"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory, repo_root):
    """The project's wheel, built offline from a copy of the checkout (so the checkout gets no build folders)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "src"
    shutil.copytree(
        repo_root, source, symlinks=True,
        ignore=shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache"),
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(tmp / "dist"), str(source)],
        check=True, capture_output=True, text=True,
    )
    (built,) = (tmp / "dist").glob("hf_sentcl-*.whl")
    return built


@pytest.mark.slow
def test_wheel_holds_the_card_template(wheel, repo_root):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert TEMPLATE in names
        assert archive.read(TEMPLATE) == (repo_root / "model_cards" / "sentence_encoder.md").read_bytes()
    assert "hf_sentcl/evaluation/mteb.py" in names and not any(n.startswith("model_cards/") for n in names)


@pytest.mark.slow
def test_export_from_a_plain_install_writes_its_card(wheel, tiny_bert_dir, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(target), str(wheel)],
        check=True, capture_output=True, text=True,
    )
    env = {**os.environ, "PYTHONPATH": str(target), "HF_HUB_OFFLINE": "1"}
    where = subprocess.run(
        [sys.executable, "-c", "import hf_sentcl.export.card as m; print(m.__file__); print(m.TEMPLATE)"],
        cwd=tmp_path, env=env, check=True, capture_output=True, text=True,
    ).stdout.split()
    assert all(path.startswith(str(target)) for path in where), where  # nothing from the checkout
    done = subprocess.run(
        [sys.executable, "-m", "hf_sentcl", "export", str(tiny_bert_dir), "out", "--pooling", "mean",
         "--repo-id", "org/name"],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    card = (tmp_path / "out" / "README.md").read_text()
    assert "## Usage" in card and 'SentenceTransformer("org/name")' in card
