"""`hf-sentcl push OUT --repo-id ORG/NAME`: upload an export folder to the Hub."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from hf_sentcl.common import exits
from hf_sentcl.common.logs import setup_logging
from hf_sentcl.export.mteb_meta import MODEL_META_MODULE
from hf_sentcl.export.publish import carded_for, check_pushable, push_export, usage_snippets
from hf_sentcl.hub.upload import (
    ATTEMPTS_ENV,
    BACKOFF_ENV,
    DEFAULT_ATTEMPTS,
    DEFAULT_BACKOFF_S,
    HubApi,
    HubError,
    format_upload_plan,
    upload_plan,
)
from hf_sentcl.recipe.run_folder import clear_recorded_failure


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-sentcl push", description=__doc__.splitlines()[0],
        epilog=f"Transient Hub failures (connection refused or reset, timeouts, HTTP 429 and 5xx) are retried: "
               f"{ATTEMPTS_ENV} attempts in all (default {DEFAULT_ATTEMPTS}), waiting {BACKOFF_ENV} seconds "
               f"(default {DEFAULT_BACKOFF_S:g}) doubled after each, with jitter. A push can be run again safely.",
    )
    parser.add_argument("folder", help="An export folder written by `hf-sentcl export` or a recipe run.")
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


def main(argv: Sequence[str] | None = None, api: HubApi | None = None) -> int:
    """CLI entry point; `api` replaces `huggingface_hub.HfApi` (tests pass a recorder)."""
    args = build_parser().parse_args(argv)
    setup_logging()
    visibility = "private" if args.private else "the Hub's default visibility for a new repository"
    target = f"{args.repo_id}" + (f" (branch {args.revision})" if args.revision else "")
    try:  # refused before the Hub is contacted: exit 2
        check_pushable(args.folder, args.repo_id, args.mteb_results)
    except (HubError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return exits.BAD_INPUT
    try:
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
        return exits.FAILED
    print(f"Uploaded {len(result.files)} files to {target}: {result.url}")
    if clear_recorded_failure(args.folder, "push_error"):
        print(f"The run in {Path(args.folder).parent} is complete now: its push had failed at the end of training.")
    if mteb_folder is not None:
        print(f"MTEB results filed under the pushed commit: {mteb_folder}")
        print(f"ModelMeta for mteb's model registry, with that revision: {Path(args.mteb_results) / MODEL_META_MODULE}")
    return 0
