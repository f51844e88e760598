"""The reliability of a run's checkpoints, as mixins of `transformers.Trainer` that `ContrastiveTrainer` combines.

- `DurableCheckpoints`: a checkpoint is resumed from only once complete (the completion mark, written after every
  process has written its files, with a crc32 of each: `hf_sentcl.trainers.checkpoint_files`); older checkpoints are
  rotated only after the new one's mark; every process learns of a failed write (a full disk ends the run on all
  of them, with the space needed); no checkpoint is written after a non-finite loss; a preempted run skips the
  Trainer's final reload of the best checkpoint and a resumed run already at `max_steps` trains no step.
- `MasterWeightsSave`: under DeepSpeed's 16-bit engines the saved weights are the fp32 masters, and with
  `save_on_each_node` every node's first process writes the weights of its copy.

They need from the class they are mixed into: `nonfinite_loss` (`hf_sentcl.modeling.health.NonFiniteLossFlag`) and
`preemption` (`hf_sentcl.trainers.callbacks.PreemptionCallback`).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from hf_sentcl.common.distributed import _long_wait_group, world_size
from hf_sentcl.modeling.health import CHECKPOINT_COMPLETE, TrainingFailure
from hf_sentcl.trainers.checkpoint_files import (
    delete_checkpoint,
    disk_full_failure,
    folder_bytes,
    is_disk_full,
    rotate_old_checkpoints,
    write_completion_mark,
)
from hf_sentcl.trainers.master_weights import master_state_dict, restore_master_weights, weights_snapshot

_WRITE_OK, _WRITE_FAILED, _DISK_FULL = 0, 1, 2


def settle_checkpoint_write(folder: Path, error: BaseException | None, remove: bool) -> None:
    """After every process's attempt at writing (part of) checkpoint `folder` (`error`: its exception, or None): one
    all-reduce of two integers on a gloo group tells every process whether any failed, so that all raise rather than
    some waiting in the barrier that follows for one that has died. A full disk anywhere: the half-written folder
    is removed (by the process that saves, if `remove`) and every process raises `disk_full_failure`; another error
    is re-raised where it happened, and the other processes raise TrainingFailure pointing at it."""
    state = _WRITE_OK if error is None else _DISK_FULL if is_disk_full(error, folder) else _WRITE_FAILED
    written = folder_bytes(folder) if state != _WRITE_OK else 0
    if world_size() > 1:
        flags = torch.tensor([state, written], dtype=torch.int64)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=_long_wait_group())
        state, written = flags.tolist()
    if state == _WRITE_OK:
        return
    if state == _WRITE_FAILED:
        if error is not None:
            raise error
        raise TrainingFailure(f"another process failed while writing checkpoint '{folder}'; its error is in the log.")
    if remove:
        shutil.rmtree(folder, ignore_errors=True)
    if world_size() > 1:  # the folder is gone before any process measures the free space
        dist.barrier(group=_long_wait_group())
    raise disk_full_failure(folder, written) from error


class DurableCheckpoints:
    """Checkpoints that are complete or never resumed from, rotated only after the next one is (module docstring)."""

    def _run_epoch(self, *args, **kwargs):
        """Trainer's pass over the data, skipped when a resumed checkpoint is already at `max_steps` (a run stopped
        after training: the requeued run only evaluates and exports). Trainer would run one step past max_steps
        first: it checks the step count only after each step."""
        if self.state.max_steps > 0 and self.state.global_step >= self.state.max_steps:
            self.control.should_training_stop = True
            return None
        return super()._run_epoch(*args, **kwargs)


    def _finalize_training(self, *args, **kwargs):
        """Trainer's end of training, except that with `save_total_limit: 1` the last checkpoint is kept when it is
        not the best: Trainer would delete it here, and a run stopped before its final evaluation and export would
        then resume from the best checkpoint and train the steps after it again. `prune_after_run` deletes it once
        the run is complete."""
        with self._save_total_limit(None if self.args.save_total_limit == 1 else self.args.save_total_limit):
            return super()._finalize_training(*args, **kwargs)


    @contextmanager
    def _save_total_limit(self, value: int | None) -> Iterator[int | None]:
        """`args.save_total_limit` set to `value` inside the block (the Trainer's own rotation reads it), the real
        one (which the block yields) back afterwards."""
        limit = self.args.save_total_limit
        self.args.save_total_limit = value
        try:
            yield limit
        finally:
            self.args.save_total_limit = limit


    def prune_after_run(self) -> None:
        """With `save_total_limit: 1`, delete every checkpoint but the best once the run is complete (process 0), as
        Trainer does at the end of training (see `_finalize_training`)."""
        best = self.state.best_model_checkpoint
        if self.args.save_total_limit != 1 or not best or not Path(best).is_dir() or not self.args.should_save:
            return
        for checkpoint in Path(self._get_output_dir(trial=None)).glob(f"{PREFIX_CHECKPOINT_DIR}-*"):
            if checkpoint.is_dir() and not checkpoint.samefile(best):
                delete_checkpoint(checkpoint)


    def _load_best_model(self) -> None:
        """Trainer's reload of the best checkpoint at the end, skipped when a preemption stopped training: the run
        ends at once and the requeued run reloads it when it really ends."""
        if self.preemption.stop_step is None:
            super()._load_best_model()


    def _save_checkpoint(self, model, trial) -> None:
        """Trainer's checkpoint, then the completion mark (`hf_sentcl.modeling.health.CHECKPOINT_COMPLETE`) once every
        process has written its files, then the rotation of older checkpoints (`save_total_limit`). A checkpoint cut
        off while being written has no mark and is never resumed from; a mark left from an earlier write of the same
        folder is removed first. The mark lists every file with its size and crc32
        (`hf_sentcl.trainers.checkpoint_files`), so a resume tells a damaged checkpoint.

        Rotation: the Trainer's own runs inside its `_save_checkpoint`, before the mark, and would leave a process
        killed between the two (with `save_total_limit: 1`) without any usable checkpoint. It is switched off for
        that call and done here once the mark is written (`rotate_old_checkpoints`, the process that saves), never
        deleting the new checkpoint or the best one.

        Every process learns whether any failed to write (`settle_checkpoint_write`: after the weights, which the
        Trainer follows with a barrier once it tracks a best checkpoint, after the rest, and after the mark), so a
        failure ends the run on every process instead of leaving the others in a barrier. A full disk ends it with
        TrainingFailure naming the folder, the free and the needed space; the half-written folder is removed and
        the previous checkpoint is untouched (no rotation before a mark)."""
        self.nonfinite_loss.check()  # never save weights updated from a NaN/inf loss
        run_dir = Path(self._get_output_dir(trial=trial))
        folder = run_dir / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        if self.args.should_save:
            (folder / CHECKPOINT_COMPLETE).unlink(missing_ok=True)
        # no rotation by Trainer._save_checkpoint (it would precede the mark): done below
        with self._settled_checkpoint_write(folder), self._save_total_limit(None) as limit:
            super()._save_checkpoint(model, trial)
        self.accelerator.wait_for_everyone()
        error = None
        if self.args.should_save:
            try:
                write_completion_mark(folder, self.state.global_step)
            except OSError as err:  # e.g. the disk filled up: the files are whole, the older checkpoints untouched
                error = err
        settle_checkpoint_write(folder, error, remove=False)
        if self.args.should_save:
            rotate_old_checkpoints(run_dir, limit, keep=(folder, self.state.best_model_checkpoint))


    @contextmanager
    def _settled_checkpoint_write(self, folder: Path) -> Iterator[None]:
        """Around the Trainer's writing of checkpoint `folder`: `settle_checkpoint_write` once the block ends (with
        its error, if any), and, inside it, `save_model` replaced by one that settles right after the weights (the
        Trainer follows them with a barrier that a process whose write failed would never reach). Every process
        raises if any failed. The saved arguments (training_args.bin, written with the weights) keep the
        `save_total_limit` the block starts with."""
        save_model, own_attribute, settled = self.save_model, vars(self).get("save_model"), False
        remove, limit = self.args.should_save, self.args.save_total_limit

        def save_model_then_settle(*args, **kwargs) -> None:
            nonlocal settled
            try:
                with self._save_total_limit(limit):
                    save_model(*args, **kwargs)
            except Exception as err:  # every process must hear of it before the Trainer's barrier
                settled = True
                settle_checkpoint_write(folder, err, remove=remove)
                raise  # not reached: settle raises on every process
            settled = True
            settle_checkpoint_write(folder, None, remove=remove)
            settled = False

        self.save_model = save_model_then_settle  # for this call only: Trainer._save_checkpoint calls it once
        try:
            yield
        except Exception as err:
            if not settled:  # else every process raised in save_model_then_settle already
                settle_checkpoint_write(folder, err, remove=remove)
            raise
        else:
            settle_checkpoint_write(folder, None, remove=remove)
        finally:
            if own_attribute is None:
                del self.save_model
            else:
                self.save_model = own_attribute


    def _maybe_log_save_evaluate(self, tr_loss, grad_norm, model, trial, epoch, ignore_keys_for_eval, start_time,
                                 learning_rate=None):
        """Trainer's log/evaluate/save, after reading the non-finite-loss flag when any of them is due (or training
        ends): a NaN update stops training here, before it is logged as a number, evaluated or saved."""
        control = self.control
        if control.should_log or control.should_evaluate or control.should_save or control.should_training_stop:
            self.nonfinite_loss.check()
        super()._maybe_log_save_evaluate(
            tr_loss, grad_norm, model, trial, epoch, ignore_keys_for_eval, start_time, learning_rate=learning_rate
        )


class MasterWeightsSave:
    """The saved weights under DeepSpeed's 16-bit engines and on each node (module docstring)."""

    def train(self, *args, **kwargs):
        """`Trainer.train`; under DeepSpeed's 16-bit engines, first a copy of the weights as they are before the engine
        casts the module to 16 bits: the trained ones start the fp32 masters of a fresh run, the frozen ones are saved
        (`hf_sentcl.trainers.master_weights`)."""
        if self.is_deepspeed_enabled and self.deepspeed is None and (self.args.bf16 or self.args.fp16):
            self._weights_before_cast = weights_snapshot(self.accelerator.unwrap_model(self.model))
        return super().train(*args, **kwargs)


    def start_masters_at_full_precision(self) -> None:
        """When training begins (the engine built, a checkpoint loaded): a fresh DeepSpeed run's fp32 masters start
        from the weights before the 16-bit cast (a resumed run has them from its checkpoint)."""
        snapshot = getattr(self, "_weights_before_cast", None)
        if snapshot and self.state.global_step == 0:
            restore_master_weights(self.accelerator.unwrap_model(self.model), snapshot)


    def _save(self, output_dir: str | None = None, state_dict=None) -> None:
        """Trainer's save of the weights, config and tokenizer, written by every node's first process with
        `save_on_each_node` (disks local to each node): transformers 5's `save_pretrained` writes only on global rank
        0 once a process group exists, which left every other node's copy of each checkpoint without its weights."""
        if not (self.args.save_on_each_node and self.args.should_save and world_size() > 1 and dist.get_rank() != 0):
            return super()._save(output_dir, state_dict)
        model = self.accelerator.unwrap_model(self.model, keep_torch_compile=False)
        model.should_save_on_this_rank = lambda is_main_process: is_main_process
        try:
            return super()._save(output_dir, state_dict)
        finally:
            del model.should_save_on_this_rank


    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """`Trainer.save_model`, except under DeepSpeed, where the weights saved (in checkpoints, in output_dir, and so
        in the export) are the optimizer's fp32 master weights, not the engine's 16-bit module cast back
        (`master_state_dict`; every process takes part)."""
        if not self.is_deepspeed_enabled or self.deepspeed is None:
            return super().save_model(output_dir, _internal_call)
        module = self.accelerator.unwrap_model(self.model)
        state = master_state_dict(module, getattr(self, "_weights_before_cast", {}), keep=self.args.should_save)
        self._save(output_dir or self.args.output_dir, state_dict=state)
