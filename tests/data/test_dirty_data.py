"""Dirty training data ("Preemptible training", item 4): each defect of a training file is either repaired or dropped
with a count (logged once on the `hf_sentcl` logger and reported in results.json's `train.data_cleaning`), or refused
before any model loads with exit 2 and an `error:` line naming the file and the line. Never a silent drop, never a
traceback. The policy per defect, and why, is in `hf_sentcl/data/checks.py`."""

import csv
import json
import logging

import pytest
from helpers import random_sentences, write_recipe

from hf_sentcl import SentenceEncoder
from hf_sentcl.cli.train import main
from hf_sentcl.configs import DataArguments
from hf_sentcl.data.cleaning import MIN_TEXT_CHARS, max_text_chars
from hf_sentcl.data.corpus import load_training_data
from hf_sentcl.data.nli import check_nli_source, read_nli_pairs, resolve_nli_source

LINES = 200  # more than 100, so one line with invalid UTF-8 stays under the 1% that is refused


@pytest.fixture
def sentences():
    return random_sentences(LINES, seed=11)


def write_lines(path, lines: list[bytes], end: bytes = b"\n"):
    path.write_bytes(b"".join(line + end for line in lines))
    return path


def load(path, caplog, text_columns=("text",), optional=(), **data_args):
    """Load like a run does; return (dataset, results.json's data_cleaning, the one hf_sentcl log line about it)."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hf_sentcl"):
        dataset, report = load_training_data(DataArguments(train_file=str(path), **data_args), text_columns, optional)
    logged = [r for r in caplog.records if r.name == "hf_sentcl" and path.name in r.getMessage()]
    assert len(logged) == 1, [r.getMessage() for r in caplog.records]
    cleaning = report.as_dict()
    assert cleaning["file"] == path.name and cleaning["rows_kept"] == len(dataset)
    return dataset, cleaning, logged[0]


def others_zero(cleaning, *keys):
    counts = ("blank_lines_dropped", "missing_value_rows_dropped", "invalid_utf8_lines_repaired",
              "nul_lines_repaired", "crlf_line_ends_normalised", "lines_truncated")
    return all(cleaning[k] == 0 for k in counts if k not in keys)


# ------------------------------------------------------------------------------------------ the text file
def test_invalid_utf8_bytes_are_replaced_and_counted(tmp_path, caplog, sentences):
    """A few bad bytes in a big corpus: U+FFFD in their place, the lines counted (first line named), WARNING."""
    lines = [s.encode() for s in sentences]
    lines[6] = b"the cat \xff plays"
    lines[50] = b"a dog \xc3 runs"  # a lead byte without its continuation
    dataset, cleaning, record = load(write_lines(tmp_path / "corpus.txt", lines), caplog)
    assert dataset["text"][6] == "the cat \ufffd plays" and dataset["text"][50] == "a dog \ufffd runs"
    assert len(dataset) == LINES
    assert cleaning["invalid_utf8_lines_repaired"] == 2 and cleaning["first_line"]["invalid_utf8_lines_repaired"] == 7
    assert others_zero(cleaning, "invalid_utf8_lines_repaired")
    assert record.levelno == logging.WARNING and "2 line(s) with invalid UTF-8 repaired" in record.getMessage()
    assert "first: line 7" in record.getMessage()


def test_nul_bytes_are_removed_and_counted(tmp_path, caplog, sentences):
    """NULs go, the rest of the line stays; a line of NULs alone is then blank and dropped (counted under both)."""
    lines = [s.encode() for s in sentences]
    lines[3] = b"the\x00 cat plays\x00"
    lines[9] = b"\x00\x00"
    dataset, cleaning, record = load(write_lines(tmp_path / "corpus.txt", lines), caplog)
    assert all("\x00" not in text for text in dataset["text"])
    assert dataset["text"][3] == "the cat plays" and len(dataset) == LINES - 1
    assert cleaning["nul_lines_repaired"] == 2 and cleaning["first_line"]["nul_lines_repaired"] == 4
    assert cleaning["blank_lines_dropped"] == 1 and cleaning["first_line"]["blank_lines_dropped"] == 10
    assert record.levelno == logging.WARNING and "2 line(s) with NUL bytes repaired" in record.getMessage()


def test_crlf_line_ends_are_normalised_and_counted(tmp_path, caplog, sentences):
    """A Windows file trains like its LF copy (no '\\r' in any sentence); the line ends are counted, at INFO."""
    dataset, cleaning, record = load(write_lines(tmp_path / "corpus.txt", [s.encode() for s in sentences],
                                                 end=b"\r\n"), caplog)
    assert dataset["text"] == sentences
    assert cleaning["crlf_line_ends_normalised"] == LINES and cleaning["first_line"]["crlf_line_ends_normalised"] == 1
    assert others_zero(cleaning, "crlf_line_ends_normalised") and cleaning["rows_read"] == LINES
    assert record.levelno == logging.INFO and f"{LINES} CRLF/CR line end(s) read as LF" in record.getMessage()


def test_blank_lines_are_dropped_and_counted(tmp_path, caplog, sentences):
    lines = [s.encode() for s in sentences]
    lines[1:1] = [b"", b"  \t "]
    lines.append(b"")
    dataset, cleaning, record = load(write_lines(tmp_path / "corpus.txt", lines), caplog)
    assert dataset["text"] == sentences
    assert cleaning["rows_read"] == LINES + 3 and cleaning["rows_kept"] == LINES
    assert cleaning["blank_lines_dropped"] == 3 and cleaning["first_line"]["blank_lines_dropped"] == 2
    assert others_zero(cleaning, "blank_lines_dropped")
    assert record.levelno == logging.INFO and "3 blank line(s) dropped (first: line 2)" in record.getMessage()


def test_a_100000_character_line_is_kept_but_cut(tmp_path, caplog, sentences):
    """Kept (it is text), stripped and cut to the bound that max_seq_length tokens cannot reach, and counted."""
    lines = [s.encode() for s in sentences]
    lines[4] = b"  " + b"word " * 20_000  # 100,002 characters
    dataset, cleaning, record = load(write_lines(tmp_path / "corpus.txt", lines), caplog, max_seq_length=16)
    bound = max_text_chars(16)
    assert bound < 100_000 and cleaning["max_chars_per_text"] == bound
    assert dataset["text"][4] == ("word " * 20_000).strip()[:bound] and len(dataset) == LINES
    assert max(map(len, dataset["text"])) == bound
    assert cleaning["lines_truncated"] == 1 and cleaning["first_line"]["lines_truncated"] == 5
    assert record.levelno == logging.WARNING and "1 text(s) longer than 10,000 characters cut" in record.getMessage()


# ------------------------------------------------------------------------------------------ the training csv
def write_triplets(path, sentences, rows=None):
    """sent0,sent1,hard_neg (supervised SimCSE's columns) from sentences, with `rows` {line: text} replacing lines."""
    lines = ["sent0,sent1,hard_neg"] + [f"{a},{b},{c}" for a, b, c in zip(sentences[0::3], sentences[1::3],
                                                                             sentences[2::3])]
    for line, text in (rows or {}).items():
        lines[line - 1] = text
    path.write_text("\n".join(lines) + "\n")
    return path


def test_csv_rows_with_a_missing_value_are_dropped_with_their_line(tmp_path, caplog, sentences):
    """An empty cell or a short row in a column the method reads: the row is dropped and counted, first line named.
    "NA"/"null"/"None" are sentences, not missing values."""
    path = write_triplets(tmp_path / "triplets.csv", sentences, {
        4: "a cat plays,,a dog runs",  # empty sent1
        7: "a cat plays,the cat plays",  # no hard_neg at all
        9: "NA,null,None",
    })
    rows = (LINES // 3)
    dataset, cleaning, record = load(path, caplog, ("sent0", "sent1"), ("hard_neg",))
    assert dataset.column_names == ["sent0", "sent1", "hard_neg"] and len(dataset) == rows - 2
    assert "a cat plays" not in dataset["sent0"] and ["NA", "null", "None"] in [list(r.values()) for r in dataset]
    assert cleaning["missing_value_rows_dropped"] == 2 and cleaning["first_line"]["missing_value_rows_dropped"] == 4
    assert others_zero(cleaning, "missing_value_rows_dropped") and cleaning["rows_read"] == rows
    assert record.levelno == logging.WARNING
    assert "2 row(s) with a missing value dropped (first: line 4)" in record.getMessage()
    # pairs only: the short row has both sentences, and is kept
    dataset, cleaning, _ = load(path, caplog, ("sent0", "sent1"))
    assert cleaning["missing_value_rows_dropped"] == 1 and len(dataset) == rows - 1


def test_nli_pairs_missing_a_value_or_a_gold_label_are_counted(tmp_path, caplog):
    """ConSERT's labelled NLI csv: a row without its label is a missing value; SNLI's '-' is counted apart."""
    path = tmp_path / "nli.csv"
    path.write_text("premise,hypothesis,label\na cat,an animal,entailment\nx,y,-\na dog,a cat,\n\na man,a person,1\n")
    with caplog.at_level(logging.INFO, logger="hf_sentcl"):
        pairs, report = read_nli_pairs(resolve_nli_source(str(path)))
    cleaning = report.as_dict()
    assert pairs["label"] == [0, 1] and cleaning["rows_read"] == 5 and cleaning["rows_kept"] == 2
    assert cleaning["missing_value_rows_dropped"] == 1 and cleaning["first_line"]["missing_value_rows_dropped"] == 4
    assert cleaning["blank_lines_dropped"] == 1 and cleaning["no_gold_label_rows_dropped"] == 1
    logged = [r.getMessage() for r in caplog.records if r.name == "hf_sentcl"]
    assert len(logged) == 1 and "1 pair(s) without a gold label dropped" in logged[0]


# ------------------------------------------------------------------------------------------ refused before loading
@pytest.fixture
def refused(tmp_path, tiny_bert_dir, senteval_dir, capsys, monkeypatch):
    """Run the CLI on a recipe training on `path`; assert exit 2, one `error:` line, no traceback, nothing written,
    no model loaded; return the error."""

    def no_model(*args, **kwargs):
        pytest.fail("a model was loaded before the training file was checked")

    monkeypatch.setattr(SentenceEncoder, "from_backbone", no_model)
    monkeypatch.setattr(SentenceEncoder, "from_pretrained", no_model)

    def run(path, method="simcse") -> str:
        recipe = write_recipe(tmp_path, method=method, model_name_or_path=str(tiny_bert_dir), train_file=str(path),
                              sts_data_dir=str(senteval_dir), output_dir=str(tmp_path / "out"),
                              per_device_train_batch_size=4, max_seq_length=16)
        code = main([str(recipe)])
        err = capsys.readouterr().err
        assert code == 2, err
        assert err.startswith("error: ") and "Traceback" not in err and err.count("\n") == 1
        assert not (tmp_path / "out").exists()
        return err

    return run


def test_mostly_invalid_utf8_is_refused_with_the_first_line(tmp_path, refused, sentences):
    """More than 1% of the lines: another encoding (Latin-1 here), refused rather than blanked out."""
    lines = [s.encode() for s in sentences]
    for i in (12, 30, 31):
        lines[i] = f"un caf\u00e9 noir {i}".encode("latin-1")
    path = write_lines(tmp_path / "latin1.txt", lines)
    err = refused(path)
    assert f"train_file '{path}' is not UTF-8 text: line 13 has the byte 0xe9" in err
    assert "3 of 200 lines have invalid bytes: more than 1%" in err


def test_csv_unbalanced_quote_is_refused_where_it_opened(tmp_path, refused, sentences):
    """The quote opened on line 5 closes on line 8, so the parser would read lines 5-8 as one field and still see
    three fields: refused, naming line 5."""
    path = write_triplets(tmp_path / "triplets.csv", sentences, {5: '"a cat plays,the cat plays,a dog runs',
                                                                 8: 'a man sings",the man sings,a bird flies'})
    err = refused(path, method="simcse_sup")
    assert f"train_file '{path}' line 5: a quoted field opens on this line and runs on to line 8" in err
    # unclosed to the end of the file
    path = write_triplets(tmp_path / "eof.csv", sentences, {30: '"a cat plays,the cat plays,a dog runs'})
    err = refused(path, method="simcse_sup")
    assert f"train_file '{path}' line 30: a quote (\") opens a field on this line and is never closed" in err


def test_csv_extra_column_is_refused_naming_the_line(tmp_path, refused, sentences):
    path = write_triplets(tmp_path / "triplets.csv", sentences, {6: "a cat, the big one,the cat plays,a dog runs",
                                                                 20: "a,b,c,d"})
    err = refused(path, method="simcse_sup")
    assert f"train_file '{path}' line 6: 4 fields where the header (line 1) has 3 (2 row(s) like this)" in err


def test_nli_file_with_an_unbalanced_quote_is_refused_before_loading(tmp_path):
    """ConSERT's NLI file goes through the same check (`NLITrainData.check`, run by validate_recipe)."""
    path = tmp_path / "nli.csv"
    path.write_text('premise,hypothesis,label\na cat,an animal,entailment\n"a dog,a cat,contradiction\nx,y,1\n')
    with pytest.raises(ValueError, match=rf"NLI file '{path}' line 3: a quote"):
        check_nli_source(resolve_nli_source(str(path)))


# ------------------------------------------------------------------------------------------ end to end
@pytest.mark.slow
def test_a_dirty_corpus_trains_and_reports_its_cleaning(tmp_path, tiny_bert_dir, senteval_dir, caplog):
    """Through the CLI: a corpus with every text defect trains, and results.json holds the counts."""
    sentences = random_sentences(120, seed=12)  # one bad line in 122 is under the 1% that is refused
    lines = [s.encode() for s in sentences]
    lines[2] = b"the cat \xff plays"
    lines[5] = b"a dog\x00 runs"
    lines[8:8] = [b"", b"   "]
    lines[12] = b"word " * 20_000
    path = write_lines(tmp_path / "dirty.txt", lines, end=b"\r\n")
    recipe = write_recipe(
        tmp_path, method="simcse", model_name_or_path=str(tiny_bert_dir), train_file=str(path),
        sts_data_dir=str(senteval_dir), output_dir=str(tmp_path / "out"), per_device_train_batch_size=4,
        max_seq_length=16, eval_strategy='"no"', save_strategy='"no"', load_best_model_at_end=False, use_cpu=True,
        eval_before_training=False, eval_tasks=[],
    )
    with caplog.at_level(logging.INFO, logger="hf_sentcl"):
        assert main([str(recipe), "--max_steps", "2"]) == 0
    cleaning = json.loads((tmp_path / "out" / "results.json").read_text())["train"]["data_cleaning"]
    assert cleaning == {
        "file": "dirty.txt", "format": "text", "rows_read": 122, "rows_kept": 120,
        "blank_lines_dropped": 2, "missing_value_rows_dropped": 0, "invalid_utf8_lines_repaired": 1,
        "nul_lines_repaired": 1, "crlf_line_ends_normalised": 122, "lines_truncated": 1,
        "max_chars_per_text": max_text_chars(16),
        "first_line": {"invalid_utf8_lines_repaired": 3, "nul_lines_repaired": 6, "crlf_line_ends_normalised": 1,
                       "blank_lines_dropped": 9, "lines_truncated": 13},
    }
    logged = [r for r in caplog.records if r.name == "hf_sentcl" and "dirty.txt" in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelno == logging.WARNING


def test_a_clean_file_reports_zero_and_logs_nothing(tmp_path, caplog, sentences):
    """The counts are there (all zero) and nothing is logged when there is nothing to say."""
    path = write_lines(tmp_path / "clean.txt", [s.encode() for s in sentences])
    with caplog.at_level(logging.INFO, logger="hf_sentcl"):
        dataset, report = load_training_data(DataArguments(train_file=str(path)), ("text",))
    assert dataset["text"] == sentences and not report.changed and report.rows_kept == LINES
    assert not [r for r in caplog.records if r.name == "hf_sentcl"]
    with (tmp_path / "pairs.csv").open("w", newline="") as f:  # csv.writer ends rows with CRLF
        csv.writer(f).writerows([("sent0", "sent1")] + list(zip(sentences[::2], sentences[1::2])))
    dataset, report = load_training_data(DataArguments(train_file=str(tmp_path / "pairs.csv")), ("sent0", "sent1"))
    assert len(dataset) == LINES // 2 and report.rows_kept == LINES // 2 and report.counts["blank_lines_dropped"] == 0


# ------------------------------------------------------------------------------------------ block-wise reading
def test_the_text_scan_reads_in_blocks_and_every_block_size_finds_the_same(tmp_path, monkeypatch, sentences):
    """A .txt corpus is scanned in blocks of whole lines (a million-line file is never held whole): blocks that end
    inside a line, between the CR and the LF of a CRLF, or inside a multi-byte character change no count, line
    number or flag. Reference: one block holding the whole file."""
    from hf_sentcl.data import block_scan, checks

    body = [s.encode() for s in sentences]  # 200 lines: one with invalid UTF-8 is under 1%
    body[3] = b"caf\xc3\xa9 au lait"  # a two-byte character
    body[7] = body[7][:4] + b"\xff" + body[7][4:]  # invalid UTF-8
    body[11] = b"   "
    body[13] = b"nul\x00inside"
    body[17] = b"x" * (MIN_TEXT_CHARS + 5)
    data = b"\n".join(body[:80]) + b"\r\n" + b"\r\n".join(body[80:140]) + b"\r" + b"\r".join(body[140:]) + b"\r"
    path = tmp_path / "mixed.txt"
    path.write_bytes(data)

    def scan(block_bytes):
        monkeypatch.setattr(block_scan, "TEXT_BLOCK_BYTES", block_bytes)
        checks._scan.cache_clear()
        return checks.scan_data_file(path)

    whole = scan(10 * len(data))
    assert (whole.rows_read, whole.invalid_utf8, whole.nul) == (200, (1, 8), (1, 14))
    assert whole.line_ends == (data.count(b"\r"), 80) and whole.usable == 199 and len(whole.long_texts) == 1
    for size in (1, 2, 3, 5, 17, 64, 1000):
        blocks = scan(size)
        assert (blocks.rows_read, blocks.usable, blocks.invalid_utf8, blocks.nul, blocks.line_ends,
                blocks.long_texts) == (whole.rows_read, whole.usable, whole.invalid_utf8, whole.nul,
                                       whole.line_ends, whole.long_texts), size
        assert (blocks.blank_rows == whole.blank_rows).all()


def _scan_in_blocks(monkeypatch, path, block_bytes, whole_file=False):
    """`scan_data_file(path)` with blocks of `block_bytes`, or (`whole_file`) by the whole-file scan that refusals
    and JSON lists take; a refusal's message instead of the scan."""
    from hf_sentcl.data import block_scan, checks

    monkeypatch.setattr(block_scan, "TEXT_BLOCK_BYTES", block_bytes)
    if whole_file:
        def read_whole(self, *args):
            raise block_scan.ReadWhole
        monkeypatch.setattr(block_scan.BlockScan, "of", read_whole)
    checks._scan.cache_clear()
    try:
        scan = checks.scan_data_file(path)
    except ValueError as err:
        return str(err)
    finally:
        monkeypatch.undo()
        checks._scan.cache_clear()
    return (scan.format, scan.rows_read, scan.usable, scan.header, scan.problem, scan.invalid_utf8, scan.nul,
            scan.line_ends, scan.long_texts, [c.tolist() for c in scan.blank_cells],
            None if scan.blank_rows is None else scan.blank_rows.tolist())


def test_the_table_and_json_lines_scans_read_in_blocks_and_find_what_the_whole_file_scan_finds(
        tmp_path, monkeypatch, sentences):
    """.csv/.tsv and .jsonl files are scanned in blocks of whole lines too (a million-row file is never held whole,
    nor its rows as Python lists): every block size, down to one byte, finds exactly what the whole-file parser
    finds: counts, first lines, blank cells, overlong texts, and refusals naming a line past the first block (JSON
    lines: what one block finds, and the counts by hand)."""

    def table(rows, delimiter=b","):
        body = [delimiter.join(row) for row in rows]
        return b"\n".join(body[:90]) + b"\r\n" + b"\r\n".join(body[90:150]) + b"\r" + b"\r".join(body[150:]) + b"\n"

    cells = [(a.encode(), b.encode()) for a, b in zip(sentences, sentences[1:] + sentences[:1])]
    cells[3] = (b"caf\xc3\xa9 au lait", cells[3][1])
    cells[7] = (cells[7][0][:4] + b"\xff" + cells[7][0][4:], cells[7][1])  # invalid UTF-8: repaired
    cells[11] = (b"   ", b"")  # blank row
    cells[13] = (b"nul\x00inside", cells[13][1])
    cells[17] = (b"x" * (MIN_TEXT_CHARS + 5), cells[17][1])
    cells[19] = (b'"a quoted, delimited text"', b"")  # a missing value
    cells[23] = (cells[23][0], b"\x00")  # missing too, once its NUL is removed
    rows = [(b"sent0", b"sent1")] + cells
    files = {"pairs.csv": table(rows), "pairs.tsv": table([(a.replace(b",", b" "), b) for a, b in rows], b"\t")}
    extra = list(rows)
    extra[160] = (b"a", b"b", b"c")
    files["extra.csv"] = table(extra)  # refused: line 161 holds three fields
    quote = list(rows)
    quote[120] = (b'"an open quote', b"x")
    files["quote.csv"] = table(quote)  # refused: the quote opened on line 121
    span = list(rows)
    span[100], span[103] = (b'"opens', b"x"), (b'closes"', b"y")
    files["span.csv"] = table(span)  # refused: a field runs from line 101 to line 104
    records = [json.dumps({"text": s}).encode() for s in sentences]
    records[5], records[9] = b"   ", records[9][:3] + b"\x00" + records[9][3:]
    files["records.jsonl"] = b"\n".join(records[:100]) + b"\r\n" + b"\r".join(records[100:]) + b"\n"
    files["list.json"] = b"\n\n  " + json.dumps([{"text": s} for s in sentences], indent=1).encode()
    bad = list(records)
    bad[150] = b'{"text": "caf\xe9"}'
    files["bad.jsonl"] = b"\n".join(bad) + b"\n"
    for name, data in files.items():
        path = tmp_path / name
        path.write_bytes(data)
        # the reference: the whole-file parser (tables, JSON lists), or one block (JSON lines: counted, no parser)
        whole = _scan_in_blocks(monkeypatch, path, 10 * len(data), whole_file=not name.endswith(".jsonl"))
        for size in (1, 2, 3, 5, 17, 64, 1000, 10 * len(data)):
            assert _scan_in_blocks(monkeypatch, path, size) == whole, (name, size)
        if name == "pairs.csv":
            assert whole[:3] == ("csv", 200, 199) and whole[5:8] == ((1, 9), (2, 15), (data.count(b"\r"), 90))
            assert [row for row, *_ in whole[8]] == [17] and whole[9][1][19] and whole[9][1][23]
        elif name == "extra.csv":
            assert whole[4].startswith(f"train_file '{path}' line 161: 3 fields where the header (line 1) has 2")
        elif name == "quote.csv":
            assert f"train_file '{path}' line 121: a quote (\") opens a field on this line and is never " in whole[4]
        elif name == "span.csv":
            assert f"'{path}' line 101: a quoted field opens on this line and runs on to line 104" in whole[4]
        elif name == "records.jsonl":
            assert whole[:3] == ("json", 199, 199) and whole[6:8] == ((1, 10), (data.count(b"\r"), 100))
        elif name == "list.json":
            assert whole[:3] == ("json", 200, 200)
        elif name == "bad.jsonl":
            assert f"train_file '{path}' is not UTF-8 text: line 151 has the byte 0xe9" in whole


def test_the_table_scan_holds_a_block_not_the_file(tmp_path, monkeypatch):
    """Scanning a 40,000-row CSV (6.4 MiB) in 64 KiB blocks allocates under a quarter of the file's size at its peak
    (the per-row flags, about 10 bytes a row, and one block's rows: 1.1 MiB); read and parsed whole, as before, it
    held 8x the file (its bytes, its text and every row as a Python list: 52 MiB)."""
    import tracemalloc

    from hf_sentcl.data import block_scan, checks

    sentences = random_sentences(400, seed=3, max_words=30)
    path = tmp_path / "big.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(("sent0", "sent1"))
        writer.writerows((f"{sentences[i % 400]} {i}", sentences[(i * 7) % 400]) for i in range(40_000))
    monkeypatch.setattr(block_scan, "TEXT_BLOCK_BYTES", 64 * 2**10)
    checks._scan.cache_clear()
    tracemalloc.start()
    try:
        scan = checks.scan_data_file(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        checks._scan.cache_clear()
    print(f"peak {peak / 2**20:.2f} MiB for a {path.stat().st_size / 2**20:.2f} MiB file")
    assert scan.usable == 40_000 and scan.problem is None
    assert peak < path.stat().st_size / 4, (peak, path.stat().st_size)
