"""`python -m hf_sentcl.run` noting which examples each process's stream gives it to train on, for the streaming
tests: `python tests/pipeline/stream_probe.py RECIPE ...` (or as the script of `accelerate launch`). Each process
appends the texts of its slice of every global batch, in order, to $HF_SENTCL_STREAM_IDS/ids.<rank> as it tokenises
them (the DataLoader reads one batch ahead of training, so a file may hold one batch more than was trained on).
Nothing else changes: the run is the user's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hf_sentcl.cli.train import main
from hf_sentcl.data.streaming import StreamedViews

IDS_DIR = Path(os.environ["HF_SENTCL_STREAM_IDS"])
tokenised = StreamedViews.tokenised


def recording(self: StreamedViews, rows: list[dict]) -> list[dict]:
    with open(IDS_DIR / f"ids.{self.split.rank}", "a", encoding="utf-8") as notes:
        notes.writelines(row["text"] + "\n" for row in rows)
    return tokenised(self, rows)


StreamedViews.tokenised = recording

if __name__ == "__main__":
    IDS_DIR.mkdir(parents=True, exist_ok=True)
    sys.exit(main())
