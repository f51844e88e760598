"""`hf_sentcl.run` with a probe: each process writes, for every training batch, the dataset it came from and the
batch's first token ids, to `<output_dir>/probe_rank<k>.json` (what tests/data/test_mixing_launch.py compares across
processes). Launched as the users launch `-m hf_sentcl.run`:

    accelerate launch --config_file recipes/accelerate_configs/multi_cpu.yaml --num_processes 2 \\
        tests/data/mixing_probe.py RECIPE [--key value ...]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from hf_sentcl.cli.train import main
from hf_sentcl.trainers.mixing import MixedSources

RECORDS: list[dict] = []


def probing(original):
    def batch_source(self, inputs):
        source = original(self, inputs)
        RECORDS.append({"step": self.state.global_step, "dataset": source,
                        "first_ids": inputs["input_ids"][:, 0, :4].tolist()})
        write_records(self.args.output_dir)  # at every batch: a multi-process run ends with os._exit
        return source

    return batch_source


def write_records(output: str) -> None:
    (Path(output) / f"probe_rank{os.environ.get('RANK', '0')}.json").write_text(json.dumps(RECORDS))


if __name__ == "__main__":
    MixedSources.batch_source = probing(MixedSources.batch_source)
    sys.exit(main(sys.argv[1:]))
