"""A full disk (or another failed write) while a run exports at its end is recorded like a refused export: under
`export_error` in the results and run_complete.json, exit status 1, what the export left removed, and a message that
says the disk filled up, gives the free space and the `hf-sentcl export OUTPUT_DIR OUTPUT_DIR/export` command that
redoes it (which then marks the run complete).

The export's safetensors writer (`transformers.modeling_utils.safe_save_file`, which both `save_pretrained` calls of
an export use) is replaced by one that writes a few bytes and raises, as safetensors and the OS do on a full disk, for
files inside the export's temporary folders only: the run's own saves still work.
"""

import errno
import json
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
import transformers.modeling_utils
from helpers import random_sentences, write_recipe
from safetensors import SafetensorError

from hf_sentcl import SentenceEncoder
from hf_sentcl.cli.export import main as export_main
from hf_sentcl.cli.train import main as train_main
from hf_sentcl.common.layout import EXPORT_DIRNAME, MTEB_RESULTS_DIRNAME, RUN_COMPLETE_JSON
from hf_sentcl.export.bundle import export_run
from hf_sentcl.export.publish import publish_run

#: what a full disk looks like to the export: the OS's error, and safetensors' own (its Rust writer's io::Error)
DISK_FULL = {
    "oserror-enospc": lambda path: OSError(errno.ENOSPC, "No space left on device", str(path)),
    "safetensors-os-error-28": lambda path: SafetensorError(
        "Error while serializing: I/O error: No space left on device (os error 28)"),
}
OTHER_WRITE_ERRORS = {
    "oserror-eio": lambda path: OSError(errno.EIO, "Input/output error", str(path)),
    "safetensors-other": lambda path: SafetensorError("Error while serializing: header too large"),
}


def fail_export_writes(monkeypatch, error) -> list[Path]:
    """Make the safetensors writes of an export (into `.export.partial-*` folders) write 100 bytes and raise
    `error(path)`; returns the paths it failed."""
    real = transformers.modeling_utils.safe_save_file
    failed: list[Path] = []

    def write(tensors, path, *args, **kwargs):
        if f".{EXPORT_DIRNAME}.partial-" not in str(path):
            return real(tensors, path, *args, **kwargs)
        failed.append(Path(path))
        Path(path).write_bytes(b"\0" * 100)
        raise error(path)

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", write)
    return failed


def run_args(out: Path, push: bool = False) -> SimpleNamespace:
    return SimpleNamespace(output_dir=str(out), hub_model_id="me/enc" if push else None, push_to_hub=push,
                           hub_private_repo=None, hub_revision=None)


def assert_nothing_left(out: Path) -> None:
    """No export, no MTEB result files, no temporary folder of the export in `out`."""
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(f".{EXPORT_DIRNAME}")) == []
    assert not (out / EXPORT_DIRNAME).exists() and not (out / MTEB_RESULTS_DIRNAME).exists()


@pytest.mark.parametrize("error", DISK_FULL.values(), ids=DISK_FULL.keys())
def test_a_full_disk_during_the_export_is_recorded_with_the_redo_command(tiny_bert_dir, tmp_path, monkeypatch,
                                                                          capsys, error):
    """publish_run: export_error says the disk filled up, with the free space and the command that redoes the
    export; the half-written export, an earlier run's export and MTEB files there are removed."""
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean").eval()
    out = tmp_path / "out"
    export_run(encoder, {"method": "simcse"}, out)  # an earlier run's export, not this run's model
    (out / MTEB_RESULTS_DIRNAME).mkdir()
    (out / MTEB_RESULTS_DIRNAME / "old.json").write_text("{}")
    failed = fail_export_writes(monkeypatch, error)
    info = publish_run(encoder, {"method": "simcse"}, run_args(out))
    assert failed and set(info) == {"export_error"}
    message = info["export_error"]
    assert message.startswith(f"the disk filled up while writing the export '{out / EXPORT_DIRNAME}'")
    assert "No space left on device" in message and "free on that disk" in message and "free space" in message
    assert f"`hf-sentcl export {out} {out / EXPORT_DIRNAME}`" in message
    assert f"\nerror: {message}\n" in "\n" + capsys.readouterr().err
    assert_nothing_left(out)


@pytest.mark.parametrize("error", OTHER_WRITE_ERRORS.values(), ids=OTHER_WRITE_ERRORS.keys())
def test_other_write_errors_are_recorded_too(tiny_bert_dir, tmp_path, monkeypatch, error):
    """Another failed write is recorded as such (not as a full disk), with the same command; a run that pushes is
    told to push after the export is redone, and nothing is pushed."""
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean").eval()
    out = tmp_path / "out"
    out.mkdir()
    fail_export_writes(monkeypatch, error)

    class NoHub:
        def __getattr__(self, name):
            pytest.fail(f"a failed export was pushed ({name})")

    message = publish_run(encoder, {"method": "simcse"}, run_args(out, push=True), api=NoHub())["export_error"]
    assert message.startswith(f"writing the export '{out / EXPORT_DIRNAME}' failed (") and "disk filled" not in message
    export = out / EXPORT_DIRNAME
    assert f"`hf-sentcl export {out} {export} --repo-id me/enc`, then push it with `hf-sentcl push {export} " \
           "--repo-id me/enc`" in message
    assert_nothing_left(out)


def test_a_run_whose_export_fills_the_disk_exits_1_and_the_command_redoes_it(tiny_bert_dir, senteval_dir, tmp_path,
                                                                              monkeypatch, capsys):
    """Through the CLI: exit 1, one error line, export_error in results.json and run_complete.json; the printed
    command exports the run and marks it complete, after which a requeued `auto` run has nothing to do."""
    corpus = tmp_path / "train.txt"
    corpus.write_text("\n".join(random_sentences(16, seed=3)) + "\n")
    out = tmp_path / "out"
    recipe = write_recipe(
        tmp_path, method="simcse", model_name_or_path=str(tiny_bert_dir), train_file=str(corpus),
        sts_data_dir=str(senteval_dir), output_dir=str(out), per_device_train_batch_size=4, max_seq_length=16,
        max_steps=1, eval_strategy='"no"', save_strategy='"no"', load_best_model_at_end=False, use_cpu=True,
        eval_before_training=False, per_device_eval_batch_size=16,
    )  # STS scores after training: `hf-sentcl export` wants results for the card
    fail_export_writes(monkeypatch, DISK_FULL["safetensors-os-error-28"])
    assert train_main([str(recipe)]) == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: the disk filled up while writing the export"), err
    recorded = json.loads((out / RUN_COMPLETE_JSON).read_text())["export_error"]
    assert json.loads((out / "results.json").read_text())["export"] == {"export_error": recorded}
    assert errors[0] == f"error: {recorded}"
    assert_nothing_left(out)
    assert (out / "model.safetensors").is_file()  # the trained encoder is intact

    monkeypatch.undo()  # room again
    command = recorded.split("`")[1::2][0]
    assert command == f"hf-sentcl export {out} {out / EXPORT_DIRNAME}"
    assert "`--data-dir DIR`, the SentEval folder, unless HF_SENTCL_DATA names it" in recorded
    monkeypatch.setenv("HF_SENTCL_DATA", str(senteval_dir))
    assert export_main(shlex.split(command)[2:]) == 0
    assert (out / EXPORT_DIRNAME / "model.safetensors").is_file()
    assert "export_error" not in json.loads((out / RUN_COMPLETE_JSON).read_text())
    capsys.readouterr()
    assert train_main([str(recipe), "--resume_from_checkpoint", "auto"]) == 0
    assert "nothing to do" in capsys.readouterr().out
