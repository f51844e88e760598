"""The WordNet reader: on a tiny hand-made database in the WordNet 3.0 file format (byte offsets, hex word
counts, adjective markers, exception lists, license header), and on the real database that the project's setup
installs (`make install` -> apt-get install wordnet-base -> /usr/share/wordnet)."""

from pathlib import Path

import pytest
from helpers import INDEX, SYNSETS, write_wordnet

from hf_sentcl.augment.wordnet import DEFAULT_WORDNET_DIR, WORDNET_ENV_VAR, WordNet, WordNetError, find_wordnet_dir

# synset key -> (words, gloss); words as WordNet writes them (lex ids added by the writer)








@pytest.fixture(scope="module")
def tiny_wordnet_dir(tmp_path_factory) -> Path:
    return write_wordnet(tmp_path_factory.mktemp("wordnet"))


@pytest.fixture(scope="module")
def tiny_wordnet(tiny_wordnet_dir) -> WordNet:
    return WordNet(tiny_wordnet_dir)


def test_synset_words_read_at_byte_offsets(tiny_wordnet):
    """Every listed lemma's offsets lead to a synset line holding that lemma; hex word counts are decoded."""
    for pos, lemmas in INDEX.items():
        for lemma, keys in lemmas.items():
            offsets = tiny_wordnet.synset_offsets(lemma, pos)
            assert len(offsets) == len(keys)
            for offset, key in zip(offsets, keys):
                words = tiny_wordnet.synset_words(pos, offset)
                assert words == [w.replace("(a)", "") for w in SYNSETS[pos][key][0]]
    assert tiny_wordnet.synset_offsets("unknown", "n") == ()


def test_synonyms_in_sense_order_without_the_word(tiny_wordnet):
    assert tiny_wordnet.synonyms("car") == ["auto", "automobile", "machine", "motorcar", "railcar", "railway_car"]
    assert tiny_wordnet.synonyms("car", max_senses=1) == ["auto", "automobile", "machine", "motorcar"]
    assert tiny_wordnet.synonyms("automobile") == ["car", "auto", "machine", "motorcar"]
    assert tiny_wordnet.synonyms("CAR", max_senses=1) == ["auto", "automobile", "machine", "motorcar"]
    assert tiny_wordnet.synonyms("goose") == [] and tiny_wordnet.synonyms("xylophone") == []


def test_adjective_markers_are_stripped(tiny_wordnet):
    assert tiny_wordnet.synonyms("speedy") == ["fast"]
    assert tiny_wordnet.synonyms("fast") == ["speedy"]


def test_inflections_via_exception_lists_and_detachment_rules(tiny_wordnet):
    """morphy: 'cars' -> car (rule s -> ''), 'children' -> child (noun.exc), 'ran' -> run (verb.exc),
    'driving' -> drive (ing -> e); candidate forms that are not lemmas of that part of speech are dropped."""
    assert tiny_wordnet.base_forms("cars", "n") == ["car"]
    assert tiny_wordnet.base_forms("children", "n") == ["child"]
    assert tiny_wordnet.base_forms("ran", "v") == ["run"]
    assert tiny_wordnet.base_forms("drives", "v") == ["drive"]
    assert tiny_wordnet.base_forms("driving", "v") == ["drive"]  # ing -> e
    assert tiny_wordnet.base_forms("faster", "a") == ["fast"]
    assert tiny_wordnet.base_forms("geese", "v") == []
    assert tiny_wordnet.synonyms("children") == ["kid", "youngster"]
    assert tiny_wordnet.synonyms("cars", max_senses=1) == ["auto", "automobile", "machine", "motorcar"]
    assert tiny_wordnet.synonyms("ran") == ["scat", "scamper"]


def test_license_header_lines_are_not_lemmas(tiny_wordnet):
    assert all(not lemma[0].isdigit() for lemmas in tiny_wordnet.index.values() for lemma in lemmas)
    assert "1" not in tiny_wordnet.index["n"]


def test_missing_database_error_names_folder_files_and_install(tmp_path, monkeypatch):
    monkeypatch.delenv(WORDNET_ENV_VAR, raising=False)
    with pytest.raises(WordNetError, match=r"(?s)missing index\.noun.*apt-get install wordnet-base.*wordnet_dir"):
        WordNet(tmp_path / "nothing")
    partial = write_wordnet(tmp_path / "partial")
    (partial / "data.verb").unlink()
    with pytest.raises(WordNetError, match=r"missing data\.verb"):
        WordNet(partial)


def test_path_from_environment_variable(tiny_wordnet_dir, monkeypatch, tmp_path):
    monkeypatch.setenv(WORDNET_ENV_VAR, str(tiny_wordnet_dir))
    assert find_wordnet_dir() == tiny_wordnet_dir
    assert WordNet().synonyms("kid") == ["child", "youngster"]
    monkeypatch.setenv(WORDNET_ENV_VAR, str(tmp_path / "elsewhere"))
    with pytest.raises(WordNetError, match=WORDNET_ENV_VAR):
        WordNet()
    assert find_wordnet_dir(tiny_wordnet_dir) == tiny_wordnet_dir  # an explicit path wins over the variable


def test_corrupt_files_fail_with_the_file_named(tmp_path):
    root = write_wordnet(tmp_path / "corrupt")
    text = (root / "index.noun").read_text().replace("goose n 1 1 @ 1 0", "goose n x 1 @ 1 0")
    (root / "index.noun").write_text(text)
    wordnet = WordNet(root)
    with pytest.raises(WordNetError, match=r"index\.noun.*'goose'"):
        wordnet.synonyms("goose")
    with pytest.raises(WordNetError, match=r"data\.noun.*offset 3"):
        wordnet.synset_words("n", 3)


# ------------------------------------------------------------------------------------------ the real database
def test_real_wordnet_installed_by_the_project_setup(monkeypatch):
    """`make install` (run by `make test` and .ci/run) installs wordnet-base; its files give known synonyms."""
    monkeypatch.delenv(WORDNET_ENV_VAR, raising=False)
    wordnet = WordNet()
    assert wordnet.path == Path(DEFAULT_WORDNET_DIR)
    assert len(wordnet.index["n"]) > 100_000  # WordNet 3.0 has 117,798 noun lemmas
    assert {"automobile", "auto", "motorcar"} <= set(wordnet.synonyms("car", max_senses=1))
    assert "automobile" in wordnet.synonyms("cars")
    assert "rapidly" in wordnet.synonyms("quickly")
    assert "kid" in wordnet.synonyms("children")  # noun.exc
    assert "glad" in wordnet.synonyms("happy")
