"""Push an export folder to the Hugging Face Hub.

    hf-sentcl push OUT --repo-id ORG/NAME [--mteb-results DIR] [--private] [--revision BRANCH] [--dry-run]

The model card is rendered again for ORG/NAME (its usage snippets load that id) in a temporary copy of the
export, and that copy is uploaded in one commit through `huggingface_hub`'s `upload_folder`; the local export is
not changed. With `--mteb-results` (the folder given to `export --mteb-results`), the MTEB result files are then
moved to `results/ORG__NAME/<pushed commit>/`, ready for a pull request to MTEB's results repository. The token
comes from `HF_TOKEN` or `hf auth login` and is never printed. `--dry-run` renders the card, lists exactly the
files that would be uploaded, shows the card's usage snippets and contacts nothing. Transient Hub failures
(connection refused or reset, timeouts, HTTP 429 and 5xx) are retried with exponential backoff
(`HF_SENTCL_PUSH_ATTEMPTS`, default 5; `HF_SENTCL_PUSH_BACKOFF_S`, default 2 s; each request of a push waits at most
`HF_SENTCL_PUSH_TIMEOUT_S`, default 60 s, for the Hub; see `hf_sentcl.hub.upload`). A Hub error ends with a message
and exit status 1; when the attempts ran out, the message gives the command to run again.

At the end of a run (`publish_run`), an export that cannot be written (a full disk or quota, another failed write:
OSError, or safetensors' SafetensorError) is recorded like a refused one, under `export_error`: what it left is
removed and the message gives the `hf-sentcl export OUTPUT_DIR OUTPUT_DIR/export` command that redoes it.
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from safetensors import SafetensorError

from hf_sentcl.common.layout import EXPORT_DIRNAME
from hf_sentcl.evaluation.mteb import mteb_available
from hf_sentcl.export.bundle import MTEB_RESULTS_DIRNAME, export_run
from hf_sentcl.export.card import rewrite_model_card
from hf_sentcl.export.mteb_files import check_rekeyable, rekey_mteb_results
from hf_sentcl.export.plan import ExportError
from hf_sentcl.hub.upload import (
    HubApi,
    HubError,
    PushResult,
    check_repo_id,
    push_command,
    push_folder,
    short_error,
    upload_plan,
)


@contextlib.contextmanager
def carded_for(folder: str | Path, repo_id: str) -> Iterator[Path]:
    """A temporary copy of the export `folder` whose model card is rendered for `repo_id`."""
    upload_plan(folder)  # HubError unless it is an export
    with tempfile.TemporaryDirectory(prefix="hf_sentcl-push-") as tmp:
        copy = Path(tmp) / Path(folder).resolve().name
        shutil.copytree(folder, copy, ignore=shutil.ignore_patterns(".git", ".cache"))
        rewrite_model_card(copy, repo_id)
        yield copy


def usage_snippets(card_path: Path) -> str:
    """The ```python blocks of a model card's Usage section."""
    text = card_path.read_text(encoding="utf-8")
    usage = text.split("## Usage", 1)[-1].split("\n## ", 1)[0]
    return "\n\n".join(part.split("```", 1)[0].rstrip() for part in usage.split("```python\n")[1:])


def retry_command(folder: str | Path, repo_id: str, *, mteb_results: str | Path | None = None,
                  private: bool | None = None, revision: str | None = None, commit_message: str | None = None) -> str:
    """The `hf-sentcl push` command that pushes the export `folder` again as `push_export` was asked to (the MTEB
    results folder only when there is one)."""
    if mteb_results is not None and not Path(mteb_results).is_dir():
        mteb_results = None
    return push_command(folder, repo_id, mteb_results=mteb_results, private=private, revision=revision,
                        commit_message=commit_message)


def check_pushable(folder: str | Path, repo_id: str, mteb_results: str | Path | None = None) -> None:
    """What a push needs, checked before the Hub is contacted: a valid repo id, an export `folder` (HubError), and
    an MTEB results folder that can be filed under the pushed commit (ValueError)."""
    check_repo_id(repo_id)
    upload_plan(folder)
    if mteb_results is not None:
        if not Path(mteb_results).is_dir():
            raise HubError(f"--mteb-results '{mteb_results}' is not a folder (give the one passed to export).")
        check_rekeyable(mteb_results)


def push_export(
    folder: str | Path,
    repo_id: str,
    *,
    mteb_results: str | Path | None = None,
    private: bool | None = None,
    revision: str | None = None,
    commit_message: str | None = None,
    api: HubApi | None = None,
) -> tuple[PushResult, Path | None]:
    """Upload the export `folder` with its card rendered for `repo_id`; then, when `mteb_results` is given, file
    those MTEB results under the pushed commit. Returns the push and the MTEB revision folder (or None).

    Transient Hub failures are retried (`hf_sentcl.hub.upload`); when the attempts are spent, the `HubError` gives
    the `hf-sentcl push` command that pushes this export again."""
    retry = retry_command(folder, repo_id, mteb_results=mteb_results, private=private, revision=revision,
                          commit_message=commit_message)
    if mteb_results is not None and not Path(mteb_results).is_dir():  # a run that wrote none: push the model alone
        mteb_results = None
    check_pushable(folder, repo_id, mteb_results)
    with carded_for(folder, repo_id) as copy:
        result = push_folder(copy, repo_id, private=private, revision=revision, commit_message=commit_message,
                             api=api, retry_command=retry)
    mteb_folder = None
    if mteb_results is not None:
        if result.commit is None:
            raise HubError(f"The Hub did not return the commit of the upload to '{repo_id}'; MTEB files not filed.")
        mteb_folder = rekey_mteb_results(mteb_results, repo_id, result.commit)
    return result, mteb_folder


def redo_export_command(output_dir: str | Path, results: dict[str, Any], args) -> str:
    """The `hf-sentcl export OUTPUT_DIR OUTPUT_DIR/export` command that writes a run's export (its card for
    `hub_model_id`, its MTEB result files where the run would have written them) as the end of the run would have;
    run into the run's own export folder, it also marks the run complete (`clear_recorded_failure`)."""
    argv = ["hf-sentcl", "export", str(output_dir), str(Path(output_dir) / EXPORT_DIRNAME)]
    if args.hub_model_id:
        argv += ["--repo-id", args.hub_model_id]
    if results.get("mteb_sts") and mteb_available():
        argv += ["--mteb-results", str(Path(output_dir) / MTEB_RESULTS_DIRNAME)]
    return shlex.join(argv)


def remove_unfinished_export(output_dir: str | Path) -> list[Path]:
    """Remove what a failed export leaves in a run's `output_dir`: the export folder and the MTEB result files,
    which after a failure are half of this run's or an earlier run's (not this run's model: a push must not send
    them). The folder the export was built in is already gone (`staged_export`). Returns what was removed."""
    removed = [Path(output_dir) / name for name in (EXPORT_DIRNAME, MTEB_RESULTS_DIRNAME)]
    removed = [folder for folder in removed if folder.exists()]
    for folder in removed:
        shutil.rmtree(folder)
    return removed


def export_write_failure(err: BaseException, encoder, results: dict[str, Any], args) -> str:
    """The message of an export that could not be written (a full disk, a quota, another failed write), after
    removing what it left: what failed, for a full disk the free space and the space an export needs, what was
    removed, and the `hf-sentcl export` command (then `hf-sentcl push`, for a run that pushes) that redoes it."""
    from hf_sentcl.trainers.checkpoint_files import is_disk_full  # lazily: the trainers load torch

    output_dir = Path(args.output_dir)
    export_dir = output_dir / EXPORT_DIRNAME
    full = is_disk_full(err, output_dir)  # before the removal below frees space
    free = shutil.disk_usage(output_dir if output_dir.exists() else output_dir.parent).free
    removed = remove_unfinished_export(output_dir)
    error = short_error(err)
    if full:
        weights = sum(p.numel() * p.element_size() for p in encoder.parameters())
        what = (f"the disk filled up while writing the export '{export_dir}' ({error}): {_size(free)} free on that "
                f"disk; an export needs about {_size(2 * weights)} while it is written (the weights twice: a "
                "temporary copy, then the export)")
        when = "Once there is room (free space on that disk)"
    else:
        what = f"writing the export '{export_dir}' failed ({error})"
        when = "Once the cause is fixed"
    gone = ", ".join(f"'{folder}'" for folder in removed)
    gone = f"What the export left ({gone}) was removed" if removed else "The half-written export was removed"
    redo = f"export the trained encoder with `{redo_export_command(output_dir, results, args)}`"
    if results.get("sts") and not results.get("mteb_sts"):  # `hf-sentcl export` then scores MTEB's protocol
        redo += " (with `--data-dir DIR`, the SentEval folder, unless HF_SENTCL_DATA names it)"
    if args.push_to_hub:
        push = push_command(export_dir, args.hub_model_id, private=args.hub_private_repo, revision=args.hub_revision)
        redo += f", then push it with `{push}`"
    return f"{what}. {gone}; the trained encoder in '{output_dir}' and its checkpoints are intact. {when}, {redo}."


def _size(count: int) -> str:
    """A byte count in MiB or GiB, for a message."""
    return f"{count / 2**30:.2f} GiB" if count >= 2**30 else f"{count / 2**20:.1f} MiB"


def card_language(codes: list[str] | None) -> str | list[str] | None:
    """A recipe's `language` for the card's metadata: one code as itself, several as a list, none as None."""
    return codes[0] if codes and len(codes) == 1 else codes or None


def publish_run(encoder, results: dict[str, Any], args, api: HubApi | None = None) -> dict[str, Any]:
    """End of a recipe run: export to `output_dir/export` with the model card (and the mteb results folder), then
    push the export when `args.push_to_hub`. A failed export (a diverged or collapsed model: nothing is written; a
    full disk or another failed write: what it wrote is removed) or push is reported under
    `export_error`/`push_error`, not raised; the run's checkpoints stay on disk. An export error from a write carries
    the `hf-sentcl export` command that redoes it; a push error (after the retries of transient failures) the
    `hf-sentcl push` command that pushes the export again, and the export is intact."""
    try:
        export_dir, plan = export_run(encoder, results, args.output_dir, repo_id=args.hub_model_id,
                                       license_id=getattr(args, "license", None),
                                       language=card_language(getattr(args, "language", None)))
    except ExportError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return {"export_error": str(err)}
    except (OSError, SafetensorError) as err:  # safetensors reports a full disk as SafetensorError, not OSError
        message = export_write_failure(err, encoder, results, args)
        print(f"error: {message}", file=sys.stderr, flush=True)
        return {"export_error": message}
    loaders = "AutoModel and SentenceTransformer" if plan.sentence_transformers else "AutoModel (no ST files)"
    print(f"Exported for {loaders}, with its model card: {export_dir}", flush=True)
    info: dict[str, Any] = {"path": str(export_dir)}
    if args.push_to_hub:
        mteb_results = Path(args.output_dir) / MTEB_RESULTS_DIRNAME
        try:
            pushed, mteb_folder = push_export(
                export_dir, args.hub_model_id, mteb_results=mteb_results,
                private=args.hub_private_repo, revision=args.hub_revision, api=api,
            )
        except (HubError, ValueError) as err:
            retry = retry_command(export_dir, args.hub_model_id, mteb_results=mteb_results,
                                  private=args.hub_private_repo, revision=args.hub_revision)
            message = str(err)  # a push that ran out of attempts already names the command
            if retry not in message:
                message += f"\nThe export in '{export_dir}' is intact; retry with `{retry}`."
            info["push_error"] = message
            print(f"error: {message}", file=sys.stderr, flush=True)
        else:
            info["pushed_to"] = pushed.url
            print(f"Pushed {len(pushed.files)} files to {pushed.url}", flush=True)
            if mteb_folder is not None:
                info["mteb_results"] = str(mteb_folder)
    return info
