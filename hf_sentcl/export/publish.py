"""Push an export folder to the Hugging Face Hub.

    hf-sentcl push OUT --repo-id ORG/NAME [--mteb-results DIR] [--private] [--revision BRANCH] [--dry-run]

The model card is rendered again for ORG/NAME (its usage snippets load that id) in a temporary copy of the
export, and that copy is uploaded in one commit through `huggingface_hub`'s `upload_folder`; the local export is
not changed. With `--mteb-results` (the folder given to `export --mteb-results`), the MTEB result files are then
moved to `results/ORG__NAME/<pushed commit>/`, ready for a pull request to MTEB's results repository. The token
comes from `HF_TOKEN` or `hf auth login` and is never printed. `--dry-run` renders the card, lists exactly the
files that would be uploaded, shows the card's usage snippets and contacts nothing. A Hub error ends with a
message and exit status 1.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hf_sentcl.export.bundle import MTEB_RESULTS_DIRNAME, export_run
from hf_sentcl.export.card import rewrite_model_card
from hf_sentcl.export.mteb_files import rekey_mteb_results
from hf_sentcl.export.plan import ExportError
from hf_sentcl.hub.upload import HubApi, HubError, PushResult, push_folder, upload_plan


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
    those MTEB results under the pushed commit. Returns the push and the MTEB revision folder (or None)."""
    with carded_for(folder, repo_id) as copy:
        result = push_folder(copy, repo_id, private=private, revision=revision, commit_message=commit_message,
                             api=api)
    mteb_folder = None
    if mteb_results is not None and Path(mteb_results).is_dir():
        if result.commit is None:
            raise HubError(f"The Hub did not return the commit of the upload to '{repo_id}'; MTEB files not filed.")
        mteb_folder = rekey_mteb_results(mteb_results, repo_id, result.commit)
    return result, mteb_folder


def publish_run(encoder, results: dict[str, Any], args, api: HubApi | None = None) -> dict[str, Any]:
    """End of a recipe run: export to `output_dir/export` with the model card (and the mteb results folder), then
    push the export when `args.push_to_hub`. A failed export (a diverged or collapsed model: nothing is written)
    or push is reported under `export_error`/`push_error`, not raised; the run's checkpoints stay on disk."""
    try:
        export_dir, _plan = export_run(encoder, results, args.output_dir, repo_id=args.hub_model_id)
    except ExportError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return {"export_error": str(err)}
    print(f"Exported for AutoModel and SentenceTransformer, with its model card: {export_dir}", flush=True)
    info: dict[str, Any] = {"path": str(export_dir)}
    if args.push_to_hub:
        try:
            pushed, mteb_folder = push_export(
                export_dir, args.hub_model_id, mteb_results=Path(args.output_dir) / MTEB_RESULTS_DIRNAME,
                private=args.hub_private_repo, revision=args.hub_revision, api=api,
            )
        except (HubError, ValueError) as err:
            info["push_error"] = str(err)
            print(f"error: {err}\nThe export in '{export_dir}' is intact; retry with `hf-sentcl push "
                  f"{export_dir} --repo-id {args.hub_model_id}`.", file=sys.stderr, flush=True)
        else:
            info["pushed_to"] = pushed.url
            print(f"Pushed {len(pushed.files)} files to {pushed.url}", flush=True)
            if mteb_folder is not None:
                info["mteb_results"] = str(mteb_folder)
    return info
