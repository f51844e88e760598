"""Checkpoints that went wrong, and `resume_from_checkpoint: auto` for requeued jobs.

- A full disk while a checkpoint is written (the writer raises ENOSPC on the second checkpoint): the run ends with
  exit 1 naming the folder and the space, the half-written folder is gone (or at least never taken as complete) and
  the previous checkpoint is complete and resumable.
- A damaged model.safetensors in the latest checkpoint (cut short, or one bit flipped in the tensor data): `latest`
  and `auto` fall back to the previous checkpoint with a warning naming the file and the defect; naming the
  damaged checkpoint is refused.
- `auto`: a fresh start into an empty output_dir, the latest usable checkpoint when there is one, `RunComplete`
  (exit 0, nothing touched) once the run finished, and unusable checkpoint leftovers removed before a fresh start.

One 2-step run (checkpoints 1 and 2, each with the completion mark's file list) is shared by the module; the folders
the tests damage are copies of it. Every test trains or uses that run (about 0.5 s per run here).
"""

import errno
import io
import json
import logging
import re
import shutil
import struct

import pytest
import torch
from helpers import random_sentences
from safetensors import SafetensorError

from hf_sentcl.cli.train import main
from hf_sentcl.common.layout import PREEMPTED_JSON, RUN_COMPLETE_JSON
from hf_sentcl.modeling.health import CHECKPOINT_COMPLETE
from hf_sentcl.recipe.parser import RecipeError, parse_recipe
from hf_sentcl.recipe.run_folder import RunComplete, check_run_folder, checkpoint_problems, resolve_resume

pytestmark = pytest.mark.slow  # every test trains, or reads the module's trained run


def write_recipe(path, **values):
    path.write_text("".join(f"{k}: {'null' if v is None else v}\n" for k, v in values.items()))
    return path


def snapshot(folder):
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


@pytest.fixture(scope="module")
def base_values(tmp_path_factory, tiny_bert_dir, senteval_dir):
    corpus = tmp_path_factory.mktemp("corpus") / "train.txt"
    corpus.write_text("\n".join(random_sentences(16, seed=2)) + "\n")
    return dict(
        method="simcse", model_name_or_path=tiny_bert_dir, train_file=corpus, sts_data_dir=senteval_dir,
        per_device_train_batch_size=4, max_seq_length=16, max_steps=2, save_steps=1, eval_steps=1,
        use_cpu="true", seed=0, eval_before_training="false", eval_tasks="[]",
    )


@pytest.fixture(scope="module")
def finished(tmp_path_factory, base_values):
    """A 2-step run started with `resume_from_checkpoint: auto` into an empty output_dir (a fresh start), keeping
    checkpoint-1 and checkpoint-2; returns (recipe values, output)."""
    root = tmp_path_factory.mktemp("finished")
    values = {**base_values, "output_dir": root / "out", "save_total_limit": None, "load_best_model_at_end": "false"}
    recipe = write_recipe(root / "recipe.yaml", **values)
    assert main([str(recipe), "--resume_from_checkpoint", "auto"]) == 0
    return values, root / "out"


def checkpoints_only(finished, destination):
    """A run cut off after its checkpoint-2: only the checkpoints of `finished`."""
    _, full = finished
    for name in ("checkpoint-1", "checkpoint-2"):
        shutil.copytree(full / name, destination / name)
    return destination


def auto_recipe(tmp_path, values, output, **changes):
    recipe = write_recipe(tmp_path / "recipe.yaml", **{**values, "output_dir": output, **changes})
    return parse_recipe(recipe, ["--resume_from_checkpoint", "auto"])


# ------------------------------------------------------------------------------------------------ a full disk
def failing_writer(real, target, error):
    """`real` (torch.save or safetensors' save_file) that, for the file named `target` of checkpoint-2, writes half
    of the bytes and then raises `error` as a full disk does."""
    def write(obj, path, *args, **kwargs):
        if not str(path).endswith(f"checkpoint-2/{target}"):
            return real(obj, path, *args, **kwargs)
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        with open(path, "wb") as file:
            file.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        raise error
    return write


@pytest.mark.parametrize("where", ["weights", "optimizer"])
def test_full_disk_while_checkpointing(tmp_path, base_values, capsys, monkeypatch, where):
    """ENOSPC at checkpoint-2 (in the weights: safetensors' own error text; in optimizer.pt: OSError ENOSPC), with
    the default save_total_limit 1 and best-model tracking: exit 1 naming the folder, the free and the needed space;
    checkpoint-2 removed, checkpoint-1 not rotated away and complete, and `latest` resumes from it."""
    out = tmp_path / "out"
    if where == "weights":
        error = SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        real = __import__("transformers").modeling_utils.safe_save_file
        monkeypatch.setattr("transformers.modeling_utils.safe_save_file",
                            failing_writer(real, "model.safetensors", error))
    else:
        error = OSError(errno.ENOSPC, "No space left on device")
        monkeypatch.setattr(torch, "save", failing_writer(torch.save, "optimizer.pt", error))
    recipe = write_recipe(tmp_path / "recipe.yaml", **base_values, output_dir=out)
    assert main([str(recipe)]) == 1
    err = capsys.readouterr().err
    assert f"error: the disk filled up while writing checkpoint '{out / 'checkpoint-2'}'" in err
    size = r"[\d.]+ (MiB|GiB)"
    assert re.search(rf"{size} free on that disk, a checkpoint needs about {size} \(the size of checkpoint-1\)", err)
    assert not (out / "checkpoint-2").exists()
    assert checkpoint_problems(out / "checkpoint-1") == []
    assert resolve_resume("r.yaml", out, "latest") == str(out / "checkpoint-1")


def test_half_written_folder_that_cannot_be_removed_is_never_complete(tmp_path, base_values, capsys, monkeypatch):
    """The same full disk where the half-written folder cannot be removed: it stays without the completion mark,
    the error says so, and `latest` still takes checkpoint-1."""
    out = tmp_path / "out"
    monkeypatch.setattr(torch, "save", failing_writer(torch.save, "optimizer.pt", OSError(errno.EDQUOT, "quota")))
    real_rmtree = shutil.rmtree
    monkeypatch.setattr(shutil, "rmtree", lambda path, *a, **k: None if "checkpoint-2" in str(path) else
                        real_rmtree(path, *a, **k))
    recipe = write_recipe(tmp_path / "recipe.yaml", **base_values, output_dir=out)
    assert main([str(recipe)]) == 1
    assert "has no completion mark and is never resumed from" in capsys.readouterr().err
    assert (out / "checkpoint-2" / "model.safetensors").is_file()
    assert not (out / "checkpoint-2" / CHECKPOINT_COMPLETE).exists()
    assert resolve_resume("r.yaml", out, "latest") == str(out / "checkpoint-1")


# ------------------------------------------------------------------------------------------------ damage
def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    return f"truncated: {len(data) - 100:,} of {len(data):,} bytes"


def flip_a_data_bit(path):
    data = bytearray(path.read_bytes())
    (header,) = struct.unpack("<Q", data[:8])
    data[8 + header + (len(data) - 8 - header) // 2] ^= 0x10  # a bit in the middle of the tensor data
    path.write_bytes(bytes(data))
    return "crc mismatch"


def break_header(path):
    data = bytearray(path.read_bytes())
    data[8] = ord("#")  # the header's opening brace
    path.write_bytes(bytes(data))
    return "header not valid JSON"


def without_file_list(checkpoint):
    """The completion mark as checkpoints written before it listed the files."""
    (checkpoint / CHECKPOINT_COMPLETE).write_text(json.dumps({"global_step": 2}) + "\n")


@pytest.mark.parametrize(("name", "damage", "old_mark"), [
    ("model.safetensors", truncate, False), ("model.safetensors", flip_a_data_bit, False),
    ("optimizer.pt", truncate, False), ("model.safetensors", truncate, True), ("model.safetensors", break_header, True),
], ids=["truncated", "bit-flipped", "optimizer-truncated", "truncated-old-mark", "bad-header-old-mark"])
def test_damaged_latest_checkpoint_skipped(tmp_path, finished, caplog, name, damage, old_mark):
    """A file of checkpoint-2 damaged: `latest` and `auto` take checkpoint-1, warning with the checkpoint, the file
    and the defect; naming checkpoint-2 is refused with the file and the defect. The mark's sizes catch a cut-short
    optimizer.pt, its crc32 a flipped bit in the weights; a mark without the file list (older checkpoints) still
    catches a cut-short model.safetensors or a broken header."""
    out = checkpoints_only(finished, tmp_path / "out")
    if old_mark:
        without_file_list(out / "checkpoint-2")
    defect = f"{name}: {damage(out / 'checkpoint-2' / name)}"
    for how in ("latest", "auto"):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="hf_sentcl"):
            assert resolve_resume("r.yaml", out, how) == str(out / "checkpoint-1")
        (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert str(out / "checkpoint-2") in warning and defect in warning
    with pytest.raises(RecipeError, match="resume_from_checkpoint") as refused:
        resolve_resume("r.yaml", out, str(out / "checkpoint-2"))
    assert defect in str(refused.value)
    assert checkpoint_problems(out / "checkpoint-1") == []


def test_completion_mark_lists_files_sizes_and_crcs(finished):
    _, full = finished
    mark = json.loads((full / "checkpoint-2" / CHECKPOINT_COMPLETE).read_text())
    files = {p.relative_to(full / "checkpoint-2").as_posix(): p.stat().st_size
             for p in (full / "checkpoint-2").rglob("*") if p.is_file() and p.name != CHECKPOINT_COMPLETE}
    assert mark["global_step"] == 2 and {name: e["size"] for name, e in mark["files"].items()} == files
    assert {name for name, e in mark["files"].items() if "crc32" in e} == set(files)  # every file a resume reads


# ------------------------------------------------------------------------------------------------ auto
def test_auto_fresh_start_then_nothing_to_do(tmp_path, finished, capsys):
    """The module's run started with `auto` into an empty output_dir; the same command again finds run_complete.json:
    exit 0 saying there is nothing to do, nothing in output_dir touched. check_run_folder raises RunComplete, which
    is no RecipeError."""
    values, full = finished
    assert (full / RUN_COMPLETE_JSON).is_file() and (full / "results.json").is_file()
    before = snapshot(full)
    assert main([str(write_recipe(tmp_path / "r.yaml", **values)), "--resume_from_checkpoint", "auto"]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert snapshot(full) == before
    with pytest.raises(RunComplete, match="holds a finished run") as done:
        check_run_folder(auto_recipe(tmp_path, values, full))
    assert not isinstance(done.value, RecipeError)


@pytest.mark.parametrize("failure", ["push_error", "export_error"])
def test_auto_into_a_finished_run_whose_publishing_failed_exits_1_saying_what_to_do(tmp_path, finished, capsys,
                                                                                   failure):
    """A run that trained and evaluated but whose export or push failed (run_complete.json records it, as the run's
    end writes it) is not "nothing to do": the same command requeued exits 1 with the recorded error (a failed push's
    names the `hf-sentcl push` command) and, for a failed export, how to export the trained encoder; nothing in
    output_dir is touched."""
    from hf_sentcl.pipeline.train import mark_run_complete

    values, full = finished
    out = tmp_path / "out"
    shutil.copytree(full, out)
    message = f"the {failure.split('_')[0]} failed (recorded by the run)."
    mark_run_complete(out, {"train": {"global_step": 2}, "export": {failure: message}})
    before = snapshot(out)
    recipe = write_recipe(tmp_path / "r.yaml", **{**values, "output_dir": out})
    assert main([str(recipe), "--resume_from_checkpoint", "auto"]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and message in captured.err and "nothing to do" not in captured.out
    assert (f"`hf-sentcl export {out} {out / 'export'}`" in captured.err) == (failure == "export_error")
    assert snapshot(out) == before
    if failure == "export_error":  # the printed command redoes the export and marks the run complete
        from hf_sentcl.cli.export import main as export_main
        from hf_sentcl.evaluation.sts import STS_TASKS

        shutil.rmtree(out / "export")
        results = json.loads((out / "results.json").read_text())  # this short run evaluated nothing; a card needs
        results["sts"] = {"after": {task: 50.0 for task in (*STS_TASKS, "Avg")}}  # scores, as a real run's has
        (out / "results.json").write_text(json.dumps(results))
        assert export_main([str(out), str(out / "export"), "--data-dir", str(values["sts_data_dir"])]) == 0
        assert "is complete now" in capsys.readouterr().out
        assert main([str(recipe), "--resume_from_checkpoint", "auto"]) == 0
        assert "nothing to do" in capsys.readouterr().out


def test_auto_resumes_the_latest_checkpoint(tmp_path, finished):
    """A run cut off after checkpoint-2 (and one that also wrote results.json before being cut off): `auto` resolves
    to checkpoint-2 and is not refused as 'already holds a run'."""
    values, _ = finished
    out = checkpoints_only(finished, tmp_path / "out")
    assert check_run_folder(auto_recipe(tmp_path, values, out)).training.resume_from_checkpoint == str(
        out / "checkpoint-2")
    (out / "results.json").write_text("{}")
    assert check_run_folder(auto_recipe(tmp_path, values, out)).training.resume_from_checkpoint == str(
        out / "checkpoint-2")


@pytest.mark.parametrize("rank", ["0", "1"])
def test_auto_removes_unusable_leftovers_and_starts_fresh(tmp_path, finished, caplog, monkeypatch, rank):
    """Only an incomplete checkpoint-1, a damaged checkpoint-2 and preempted.json: a fresh start (resume None); process
    0 removes them with a warning, another process leaves them. With results.json beside them: refused, naming it."""
    values, _ = finished
    out = checkpoints_only(finished, tmp_path / "out")
    (out / "checkpoint-1" / CHECKPOINT_COMPLETE).unlink()
    truncate(out / "checkpoint-2" / "model.safetensors")
    (out / PREEMPTED_JSON).write_text("{}")
    monkeypatch.setenv("RANK", rank)
    with caplog.at_level(logging.WARNING, logger="hf_sentcl"):
        assert check_run_folder(auto_recipe(tmp_path, values, out)).training.resume_from_checkpoint is None
    left = sorted(p.name for p in out.iterdir())
    if rank == "0":
        assert left == [] and "removing" in caplog.text and "checkpoint-2" in caplog.text
    else:
        assert left == ["checkpoint-1", "checkpoint-2", PREEMPTED_JSON]
        (out / "results.json").write_text("{}")
        with pytest.raises(RecipeError, match="already holds a run.*results.json.*no usable checkpoint"):
            check_run_folder(auto_recipe(tmp_path, values, out))
