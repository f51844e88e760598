"""Synonyms from the WordNet 3.0 database files, read directly (no NLTK).

Debian's `wordnet-base` package installs the database under /usr/share/wordnet in the format documented in
wndb(5WN): for each part of speech (noun, verb, adj, adv)

- `index.<pos>`: one line per lemma, `lemma pos synset_cnt p_cnt [ptr_symbol ...] sense_cnt tagsense_cnt
  synset_offset ...`; the offsets are listed most frequent sense first;
- `data.<pos>`: one line per synset, found at its byte offset: `offset lex_filenum ss_type w_cnt word lex_id
  [word lex_id ...] ...` (w_cnt in hexadecimal; adjectives may carry a marker such as `(a)`);
- `<pos>.exc`: irregular inflections, `inflected base [base ...]`.

License lines at the top of every file start with two spaces and are skipped. NLTK's reader refuses that
directory (it wants a `lexnames` file the package does not ship), hence this small reader.

`WordNet.synonyms(word)` maps an inflected word to its base forms (morphy(7WN): the exception lists, then the
detachment rules) and returns the other lemmas of their synsets.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

WORDNET_ENV_VAR = "WORDNET_DIR"
DEFAULT_WORDNET_DIR = "/usr/share/wordnet"
POS_FILES = {"n": "noun", "v": "verb", "a": "adj", "r": "adv"}
#: morphy(7WN) detachment rules: (suffix, replacement), tried when a word is not a lemma itself
DETACHMENT_RULES = {
    "n": (("s", ""), ("ses", "s"), ("xes", "x"), ("zes", "z"), ("ches", "ch"), ("shes", "sh"), ("men", "man"),
          ("ies", "y")),
    "v": (("s", ""), ("ies", "y"), ("es", "e"), ("es", ""), ("ed", "e"), ("ed", ""), ("ing", "e"), ("ing", "")),
    "a": (("er", ""), ("est", ""), ("er", "e"), ("est", "e")),
    "r": (),
}
_ADJECTIVE_MARKER = re.compile(r"\((?:a|p|ip)\)$")
INSTALL_HINT = (
    "Install the WordNet 3.0 database with `apt-get install wordnet-base` (Debian/Ubuntu; `make install` does it), "
    f"or point the recipe key 'wordnet_dir' or the environment variable {WORDNET_ENV_VAR} at a folder holding "
    "index.noun, data.noun, ... in the WordNet 3.0 format."
)


class WordNetError(FileNotFoundError):
    """The WordNet database is missing or unreadable; the message says where it looked and how to install it."""


def find_wordnet_dir(path: str | os.PathLike | None = None) -> Path:
    """The WordNet database folder: `path`, else $WORDNET_DIR, else /usr/share/wordnet; checked to hold the
    index and data files of every part of speech."""
    source = "wordnet_dir" if path else WORDNET_ENV_VAR if os.environ.get(WORDNET_ENV_VAR) else "default"
    folder = Path(os.path.expandvars(str(path or os.environ.get(WORDNET_ENV_VAR) or DEFAULT_WORDNET_DIR)))
    folder = folder.expanduser()
    missing = [f"{kind}.{name}" for name in POS_FILES.values() for kind in ("index", "data")
               if not (folder / f"{kind}.{name}").is_file()]
    if missing:
        raise WordNetError(
            f"WordNet database not found in '{folder}' ({source}): missing {', '.join(missing)}. {INSTALL_HINT}"
        )
    return folder


def _content_lines(path: Path) -> Iterable[str]:
    with path.open(encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if line.strip() and not line.startswith("  "):
                yield line


class WordNet:
    """The WordNet database in memory: lemma -> synset offsets per part of speech, the data files as bytes
    (synsets are read at their offsets), and the exception lists. Loading the full database takes about a
    second; instances are picklable, so data-loader workers can use them."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = find_wordnet_dir(path)
        #: lemma -> the rest of its index line (parsed on lookup: parsing 150k lines up front takes seconds)
        self.index: dict[str, dict[str, str]] = {}
        self.data: dict[str, bytes] = {}
        self.exceptions: dict[str, dict[str, tuple[str, ...]]] = {}
        for pos, name in POS_FILES.items():
            lines = (line.partition(" ") for line in _content_lines(self.path / f"index.{name}"))
            self.index[pos] = {lemma: rest for lemma, _, rest in lines}
            self.data[pos] = (self.path / f"data.{name}").read_bytes()
            exc = self.path / f"{name}.exc"
            self.exceptions[pos] = self._read_exceptions(exc) if exc.is_file() else {}

    @staticmethod
    def _read_exceptions(path: Path) -> dict[str, tuple[str, ...]]:
        return {fields[0]: tuple(fields[1:]) for fields in map(str.split, _content_lines(path)) if len(fields) > 1}

    def synset_offsets(self, lemma: str, pos: str) -> tuple[int, ...]:
        """Byte offsets in data.<pos> of the synsets of `lemma` (lower case), most frequent sense first."""
        rest = self.index[pos].get(lemma)
        if rest is None:
            return ()
        fields = rest.split()  # pos synset_cnt p_cnt [ptr_symbol ...] sense_cnt tagsense_cnt offset ...
        try:
            count = int(fields[1])
            return tuple(int(offset) for offset in fields[len(fields) - count:])
        except (IndexError, ValueError):
            raise WordNetError(
                f"{self.path}/index.{POS_FILES[pos]}: the line of '{lemma}' is not a WordNet index line: "
                f"{lemma} {rest.strip()!r}"
            ) from None

    def synset_words(self, pos: str, offset: int) -> list[str]:
        """The words of the synset at byte `offset` of data.<pos>, as written there (underscores for spaces)."""
        data = self.data[pos]
        end = data.find(b"\n", offset)
        fields = data[offset:end if end >= 0 else len(data)].decode("utf-8", errors="replace").split()
        if not fields or fields[0] != f"{offset:08d}":
            raise WordNetError(f"{self.path}/data.{POS_FILES[pos]}: no synset starts at byte offset {offset}.")
        count = int(fields[3], 16)
        return [_ADJECTIVE_MARKER.sub("", word) for word in fields[4:4 + 2 * count:2]]

    def base_forms(self, word: str, pos: str) -> list[str]:
        """morphy(7WN): the lemmas of `pos` that `word` can be an inflection of (the word itself first, if it is
        one), from the exception list and the detachment rules."""
        word = word.lower()
        index = self.index[pos]
        candidates = [word, *self.exceptions[pos].get(word, ())]
        candidates += [word[: len(word) - len(old)] + new for old, new in DETACHMENT_RULES[pos] if word.endswith(old)]
        return [form for form in dict.fromkeys(candidates) if form in index]

    def synonyms(self, word: str, max_senses: int | None = None) -> list[str]:
        """Other lemmas of the synsets of `word` (every part of speech, base forms via morphy), in WordNet's order
        (most frequent sense first), without `word` and its base forms. Multi-word lemmas keep their underscores.

        Args:
            max_senses: per part of speech and base form, use only the first (most frequent) senses; None = all.
        """
        own, found = {word.lower()}, []
        for pos in POS_FILES:
            for base in self.base_forms(word, pos):
                own.add(base)
                for offset in self.synset_offsets(base, pos)[:max_senses]:
                    found += self.synset_words(pos, offset)
        return [w for w in dict.fromkeys(found) if w.lower() not in own]
