"""Checkpoint rotation (`save_total_limit`) deletes older checkpoints only once the new one is complete.

transformers' `Trainer._save_checkpoint` rotates right after writing the files, before `ContrastiveTrainer` writes
the completion mark: with `save_total_limit: 1`, a process killed between the two left no usable checkpoint, and
`resume_from_checkpoint: auto` started the run afresh. The trainer now rotates itself, after the mark.

- a run killed (os._exit, in a subprocess) while it writes checkpoint-2's mark: checkpoint-1 is still complete and
  `latest`/`auto` take it;
- a normal run still rotates: when each mark is written the previous checkpoint is still there, right after the save
  only the new one (and the best one) is left, and the run ends with the rotated set only;
- `rotate_old_checkpoints` never deletes the new checkpoint (even below a stale later one) nor the best one.

Run as a script, this file is the killed run: it trains the recipe and dies while marking checkpoint-`KILL_STEP`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

KILLED = 137  # what a SIGKILLed process's launcher reports


def write_recipe(path: Path, **values) -> Path:
    path.write_text("".join(f"{k}: {'null' if v is None else v}\n" for k, v in values.items()))
    return path


@pytest.fixture
def values(tmp_path, tiny_bert_dir, senteval_dir):
    from helpers import random_sentences

    corpus = tmp_path / "train.txt"
    corpus.write_text("\n".join(random_sentences(16, seed=2)) + "\n")
    return dict(
        method="simcse", model_name_or_path=tiny_bert_dir, train_file=corpus, sts_data_dir=senteval_dir,
        per_device_train_batch_size=4, max_seq_length=16, max_steps=3, save_steps=1, eval_steps=1,
        use_cpu="true", seed=0, eval_before_training="false", eval_tasks="[]", save_total_limit=1,
    )


#: no dev evaluation, so no best checkpoint that rotation would keep anyway: the previous checkpoint is protected by
#: nothing but the order of rotation and mark
NO_BEST = dict(eval_strategy="no", load_best_model_at_end="false", metric_for_best_model=None)


@pytest.mark.slow
def test_killed_while_marking_keeps_the_previous_checkpoint(tmp_path, values, caplog):
    """The process dies (os._exit) while writing checkpoint-2's completion mark, save_total_limit 1: checkpoint-1 is
    still on disk and complete, `latest_complete_checkpoint` and `auto` take it, checkpoint-2 is skipped as
    incomplete."""
    import logging

    from launching import launch_env

    from hf_sentcl.recipe.run_folder import checkpoint_problems, latest_complete_checkpoint, resolve_resume

    out = tmp_path / "out"
    recipe = write_recipe(tmp_path / "recipe.yaml", **values, **NO_BEST, output_dir=out)
    killed = subprocess.run([sys.executable, __file__, str(recipe)], env=launch_env(KILL_STEP="2"),
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == KILLED, killed.stderr[-4000:]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    assert checkpoint_problems(out / "checkpoint-1") == []
    with caplog.at_level(logging.WARNING, logger="hf_sentcl"):
        assert latest_complete_checkpoint(out) == out / "checkpoint-1"
    assert "checkpoint-2" in caplog.text and "incomplete" in caplog.text
    assert resolve_resume("r.yaml", out, "auto") == str(out / "checkpoint-1")


@pytest.mark.slow
@pytest.mark.parametrize("best", [False, True], ids=["no-best", "best-tracked"])
def test_a_normal_run_still_rotates(tmp_path, values, monkeypatch, best):
    """3 checkpoints, save_total_limit 1: when each mark is written the previous checkpoint still exists; right after
    each save only the new checkpoint (and the best one, when dev evaluation tracks it) is left; the run ends with
    checkpoint-3 alone (no best tracked) or the best alone (shipped defaults: `prune_after_run`)."""
    import torch

    from hf_sentcl.cli.train import main
    from hf_sentcl.trainers import base, durable

    at_mark, after_save = {}, {}
    write_mark, save = durable.write_completion_mark, base.ContrastiveTrainer._save_checkpoint

    def recording_mark(folder, step):
        at_mark[step] = sorted(p.name for p in folder.parent.glob("checkpoint-*"))
        write_mark(folder, step)

    def recording_save(self, model, trial):
        save(self, model, trial)
        best_checkpoint = Path(self.state.best_model_checkpoint or "none").name
        after_save[self.state.global_step] = (sorted(p.name for p in out.glob("checkpoint-*")), best_checkpoint)

    monkeypatch.setattr(durable, "write_completion_mark", recording_mark)
    monkeypatch.setattr(base.ContrastiveTrainer, "_save_checkpoint", recording_save)
    out = tmp_path / "out"
    recipe = write_recipe(tmp_path / "recipe.yaml", **values, **({} if best else NO_BEST), output_dir=out)
    assert main([str(recipe)]) == 0
    for step in (2, 3):
        assert f"checkpoint-{step - 1}" in at_mark[step], at_mark
    for step, (left, best_checkpoint) in after_save.items():
        assert left == sorted({f"checkpoint-{step}"} | ({best_checkpoint} if best else set())), after_save
    final = sorted(p.name for p in out.glob("checkpoint-*"))
    assert final == ([after_save[3][1]] if best else ["checkpoint-3"])
    saved_args = torch.load(out / final[0] / "training_args.bin", weights_only=False)
    assert saved_args.save_total_limit == 1  # the checkpoint's arguments keep the real limit


def make_checkpoints(run_dir: Path, steps: list[int]) -> None:
    for step in steps:
        (run_dir / f"checkpoint-{step}").mkdir(parents=True)
        (run_dir / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")


@pytest.mark.parametrize(("steps", "limit", "new", "best", "left"), [
    ([1, 2], 1, 2, None, [2]),
    ([1, 2, 3], 2, 3, None, [2, 3]),
    ([1, 2, 3], 1, 3, 1, [1, 3]),
    ([1, 3, 5], 1, 3, None, [3]),  # a stale later checkpoint-5 (an earlier attempt) never outranks the new one
    ([1, 2], None, 2, None, [1, 2]),
    ([1, 2], 0, 2, None, [1, 2]),
], ids=["limit-1", "limit-2", "best-kept", "stale-later", "no-limit", "limit-0"])
def test_rotation_keeps_the_new_and_the_best_checkpoint(tmp_path, steps, limit, new, best, left):
    from hf_sentcl.trainers.checkpoint_files import rotate_old_checkpoints

    make_checkpoints(tmp_path, steps)
    keep = [tmp_path / f"checkpoint-{new}"] + ([str(tmp_path / f"checkpoint-{best}")] if best else [])
    rotate_old_checkpoints(tmp_path, limit, keep)
    assert sorted(int(p.name.split("-")[1]) for p in tmp_path.iterdir()) == left


if __name__ == "__main__":
    from hf_sentcl.trainers import durable

    real_mark = durable.write_completion_mark

    def killed_while_marking(folder: Path, step: int) -> None:
        """Die as SIGKILL would, once the checkpoint's files are written and before its mark is."""
        if step == int(os.environ["KILL_STEP"]):
            os._exit(KILLED)
        real_mark(folder, step)

    durable.write_completion_mark = killed_while_marking
    from hf_sentcl.cli.train import main

    sys.exit(main(sys.argv[1:]))
