"""The names of what a run writes into its output_dir: the one place that names a run folder's files.

    output_dir/
      results.json, results.md   the run's scores and settings (the model card is rendered from results.json; its
                                 `export` says where the export went and the push, or why they failed)
      plots/                     training curves and STS-B scatter plots
      model.safetensors, ...     the saved encoder (`SentenceEncoder.from_pretrained(output_dir)`)
      checkpoint-N/              Trainer checkpoints (resume, best-on-dev selection)
      export/                    the plain Hugging Face + sentence-transformers export with its card
      mteb_results/              MTEB result files for the leaderboard's results repository
      adapter/                   a LoRA adapter (`export_adapter: true`)
      <stage>/                   a chained method's earlier stage, itself a run folder (its name: the method's
                                 registry entry, e.g. ConSERT's `stage-1`)
      seed-N/, size-N/seed-M/    runs of a sweep, each a run folder; with seeds.json/.md, fewshot.json/.md/.png
      eval_before.json           the scores before training, kept so that a requeued run does not measure them again
      preempted.json             a run stopped by a signal: the checkpoint it wrote and how to resume
      run_complete.json          written last, once training, evaluation and export are done: a requeued
                                 `resume_from_checkpoint: auto` run finds it and exits 0 with nothing to do (1
                                 when it records a failed export or push, until `hf-sentcl export`/`push` redo it)
"""

from __future__ import annotations

from pathlib import Path

RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
PLOTS_DIRNAME = "plots"
EXPORT_DIRNAME = "export"
MTEB_RESULTS_DIRNAME = "mteb_results"
ADAPTER_DIRNAME = "adapter"
SEEDS_JSON = "seeds.json"
SEEDS_MD = "seeds.md"
FEWSHOT_JSON = "fewshot.json"
FEWSHOT_MD = "fewshot.md"
FEWSHOT_PNG = "fewshot.png"
PREEMPTED_JSON = "preempted.json"
RUN_COMPLETE_JSON = "run_complete.json"
EVAL_BEFORE_JSON = "eval_before.json"

#: names (glob patterns) whose presence in output_dir means it holds a finished or partial run
RUN_ENTRIES = (
    RESULTS_JSON, RESULTS_MD, "model.safetensors", "pytorch_model.bin", "*.safetensors.index.json",
    "checkpoint-*", EXPORT_DIRNAME, "stage-*", "seed-*", SEEDS_JSON, ADAPTER_DIRNAME,
)


def results_json(output_dir: str | Path) -> Path:
    return Path(output_dir) / RESULTS_JSON


def export_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / EXPORT_DIRNAME
