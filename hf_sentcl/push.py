"""Push an export folder to the Hugging Face Hub.

    python -m hf_sentcl.push OUT --repo-id ORG/NAME [--private] [--revision BRANCH] [--dry-run]

Only the export folder is uploaded (one commit through `huggingface_hub`'s `upload_folder`). The token comes
from `HF_TOKEN` or `hf auth login` and is never printed. `--dry-run` lists exactly the files that would be
uploaded and contacts nothing. A Hub error ends with a message and exit status 1; the folder is left as it was.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from huggingface_hub import ModelCard

from hf_sentcl.export import export_run
from hf_sentcl.hub import HubApi, HubError, check_repo_id, format_upload_plan, push_folder, upload_plan


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hf_sentcl.push", description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="An export folder written by `python -m hf_sentcl.export` or a recipe run.")
    parser.add_argument("--repo-id", required=True, help="Hub model repository ORG/NAME (created if missing).")
    parser.add_argument("--private", action="store_true", help="Create the repository as private.")
    parser.add_argument("--revision", default=None, help="Branch to commit to (created from main if missing).")
    parser.add_argument("--commit-message", default=None, help="Commit message.")
    parser.add_argument("--dry-run", action="store_true", help="List what would be uploaded; do not contact the Hub.")
    return parser


def card_model_id_warning(folder, repo_id: str) -> str | None:
    """A warning when README.md's usage snippets load another id than the repository being pushed to."""
    card = ModelCard.load(f"{folder}/README.md")
    if f'"{repo_id}"' in card.text:
        return None
    return (
        f"warning: the model card's usage snippets do not load '{repo_id}'. Re-export with "
        f"`python -m hf_sentcl.export CHECKPOINT {folder} --overwrite --repo-id {repo_id}` to fix them."
    )


def publish_run(encoder, results: dict[str, Any], args, api: HubApi | None = None) -> dict[str, Any]:
    """End of a recipe run: export to `output_dir/export` with the model card (and the mteb results folder), then
    push the export when `args.push_to_hub`. A failed push is reported, not raised: the export stays on disk."""
    export_dir, _plan = export_run(encoder, results, args.output_dir, repo_id=args.hub_model_id)
    print(f"Exported for AutoModel and SentenceTransformer, with its model card: {export_dir}", flush=True)
    info: dict[str, Any] = {"path": str(export_dir)}
    if args.push_to_hub:
        try:
            pushed = push_folder(
                export_dir, args.hub_model_id, private=args.hub_private_repo, revision=args.hub_revision, api=api
            )
        except HubError as err:
            info["push_error"] = str(err)
            print(f"error: {err}\nThe export in '{export_dir}' is intact; retry with `python -m hf_sentcl.push "
                  f"{export_dir} --repo-id {args.hub_model_id}`.", file=sys.stderr, flush=True)
        else:
            info["pushed_to"] = pushed.url
            print(f"Pushed {len(pushed.files)} files to {pushed.url}", flush=True)
    return info


def main(argv: Sequence[str] | None = None, api: HubApi | None = None) -> int:
    """CLI entry point; `api` replaces `huggingface_hub.HfApi` (tests pass a recorder)."""
    args = build_parser().parse_args(argv)
    try:
        check_repo_id(args.repo_id)
        files = upload_plan(args.folder)
        warning = card_model_id_warning(args.folder, args.repo_id)
        if warning:
            print(warning, file=sys.stderr)
        visibility = "private" if args.private else "the Hub's default visibility for a new repository"
        target = f"{args.repo_id}" + (f" (branch {args.revision})" if args.revision else "")
        if args.dry_run:
            print(f"Dry run: would upload to {target}, {visibility}:")
            print(format_upload_plan(files))
            return 0
        result = push_folder(
            args.folder, args.repo_id, private=True if args.private else None, revision=args.revision,
            commit_message=args.commit_message, api=api,
        )
    except HubError as err:
        print(f"error: {err}", file=sys.stderr)
        print(f"The local export in '{args.folder}' is unchanged.", file=sys.stderr)
        return 1
    print(f"Uploaded {len(result.files)} files to {target}: {result.url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
