"""Push an export folder to the Hugging Face Hub.

    python -m hf_sentcl.push OUT --repo-id ORG/NAME [--mteb-results DIR] [--private] [--revision BRANCH] [--dry-run]

The model card is rendered again for ORG/NAME (its usage snippets load that id) in a temporary copy of the
export, and that copy is uploaded in one commit through `huggingface_hub`'s `upload_folder`; the local export is
not changed. With `--mteb-results` (the folder given to `export --mteb-results`), the MTEB result files are then
moved to `results/ORG__NAME/<pushed commit>/`, ready for a pull request to MTEB's results repository. The token
comes from `HF_TOKEN` or `hf auth login` and is never printed. `--dry-run` renders the card, lists exactly the
files that would be uploaded, shows the card's usage snippets and contacts nothing. A Hub error ends with a
message and exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hf_sentcl.evaluation.mteb import rekey_mteb_results
from hf_sentcl.export import MTEB_RESULTS_DIRNAME, ExportError, export_run
from hf_sentcl.hub import HubApi, HubError, PushResult, check_repo_id, format_upload_plan, push_folder, upload_plan
from hf_sentcl.model_card import rewrite_model_card


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hf_sentcl.push", description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="An export folder written by `python -m hf_sentcl.export` or a recipe run.")
    parser.add_argument("--repo-id", required=True, help="Hub model repository ORG/NAME (created if missing).")
    parser.add_argument(
        "--mteb-results", default=None,
        help="The folder given to `export --mteb-results`: file its results under the pushed commit.",
    )
    parser.add_argument("--private", action="store_true", help="Create the repository as private.")
    parser.add_argument("--revision", default=None, help="Branch to commit to (created from main if missing).")
    parser.add_argument("--commit-message", default=None, help="Commit message.")
    parser.add_argument("--dry-run", action="store_true", help="List what would be uploaded; do not contact the Hub.")
    return parser


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
            print(f"error: {err}\nThe export in '{export_dir}' is intact; retry with `python -m hf_sentcl.push "
                  f"{export_dir} --repo-id {args.hub_model_id}`.", file=sys.stderr, flush=True)
        else:
            info["pushed_to"] = pushed.url
            print(f"Pushed {len(pushed.files)} files to {pushed.url}", flush=True)
            if mteb_folder is not None:
                info["mteb_results"] = str(mteb_folder)
    return info


def main(argv: Sequence[str] | None = None, api: HubApi | None = None) -> int:
    """CLI entry point; `api` replaces `huggingface_hub.HfApi` (tests pass a recorder)."""
    args = build_parser().parse_args(argv)
    visibility = "private" if args.private else "the Hub's default visibility for a new repository"
    target = f"{args.repo_id}" + (f" (branch {args.revision})" if args.revision else "")
    try:
        check_repo_id(args.repo_id)
        if args.mteb_results and not Path(args.mteb_results).is_dir():
            raise HubError(f"--mteb-results '{args.mteb_results}' is not a folder (give the one passed to export).")
        if args.dry_run:
            with carded_for(args.folder, args.repo_id) as copy:
                print(f"Dry run: would upload to {target}, {visibility}:")
                print(format_upload_plan(upload_plan(copy)))
                print(f"\nREADME.md rendered for {args.repo_id}; its usage snippets:\n")
                print(usage_snippets(copy / "README.md"))
            return 0
        result, mteb_folder = push_export(
            args.folder, args.repo_id, mteb_results=args.mteb_results, private=True if args.private else None,
            revision=args.revision, commit_message=args.commit_message, api=api,
        )
    except (HubError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        print(f"The local export in '{args.folder}' is unchanged.", file=sys.stderr)
        return 1
    print(f"Uploaded {len(result.files)} files to {target}: {result.url}")
    if mteb_folder is not None:
        print(f"MTEB results filed under the pushed commit: {mteb_folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
