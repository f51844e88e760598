"""Prefetch the toolkit's Hub data into the Hugging Face cache, or show where each source is read from.

    hf-sentcl data download [--what senteval,wiki1m,nli] [--revision REV] [--force]
    hf-sentcl data info [--what ...] [--data-dir DIR]

Compute nodes of many clusters have no internet: run `download` on a login node with the same HF_HOME, then
train with HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from huggingface_hub import constants, hf_hub_url

from hf_sentcl.common.argv import split_commas
from hf_sentcl.common.logs import setup_logging
from hf_sentcl.hub.download import (
    DATA_ENV_VAR,
    SIMCSE_FILES,
    SIMCSE_REPO,
    HubDataError,
    HubFile,
    cached_hub_file,
    extraction_dir,
    hub_file_path,
    is_hub_uri,
    senteval_from_hub,
    snapshot_revision,
)
from hf_sentcl.hub.offline import is_offline

PROG = "hf-sentcl data"


SENTEVAL = "senteval"


def source_file(name: str, revision: str | None) -> HubFile:
    """A short name of SIMCSE_FILES (at `revision`) or an `hf://datasets/...` address (with its own revision)."""
    if is_hub_uri(name):
        return HubFile.parse(name)
    if name not in SIMCSE_FILES:
        known = ", ".join(SIMCSE_FILES)
        raise ValueError(f"--what: unknown source '{name}'; use {known} or an hf://datasets/... file.")
    return HubFile(SIMCSE_REPO, SIMCSE_FILES[name][0], revision)


def is_archive(name: str, file: HubFile) -> bool:
    return name == SENTEVAL or file.filename.endswith(".tar")


def download(names: Sequence[str], revision: str | None, force: bool) -> None:
    """Fetch each source into the Hugging Face cache (the SentEval archive also extracted) and print where."""
    print(f"Hugging Face cache: {constants.HF_HUB_CACHE}")
    for name in names:
        file = source_file(name, revision)
        if is_archive(name, file):
            folder = senteval_from_hub(file, force=force)
            print(f"{name}: {file}\n  archive:   {cached_hub_file(file) or '?'}\n  extracted: {folder}")
        else:
            print(f"{name}: {file}\n  file: {hub_file_path(file, name, force=force)}")
    print("Offline use: keep HF_HOME (or HF_HUB_CACHE) as it is now and set HF_HUB_OFFLINE=1.")


def hub_status(name: str, file: HubFile) -> str:
    """Where a Hub source is read from now: the cached file (and extracted folder), or what would happen."""
    local = cached_hub_file(file)
    if local is None:
        if is_offline():
            return f"not cached and HF_HUB_OFFLINE is set: unavailable (run `{PROG} download --what {name}` online)"
        return f"would download {hf_hub_url(file.repo_id, file.filename, repo_type='dataset', revision=file.revision)}"
    revision = snapshot_revision(local, file.filename)
    status = f"cache {local} (revision {revision})"
    if is_archive(name, file):
        folder = extraction_dir(file, revision)
        status += f"\n    extracted {'at' if folder.is_dir() else 'on first use into'} {folder}"
    if not is_offline():
        branch = file.revision or "main"
        status += f"\n    (online: '{branch}' is checked against the Hub first; a newer revision downloads)"
    return status


def senteval_status(data_dir: str | None, file: HubFile) -> str:
    """The SentEval folder in resolution order: --data-dir, HF_SENTCL_DATA, the Hub archive."""
    for value, origin in ((data_dir, "--data-dir"), (os.environ.get(DATA_ENV_VAR), DATA_ENV_VAR)):
        if value:
            if is_hub_uri(value):
                return f"{origin} names {value}: {hub_status(SENTEVAL, HubFile.parse(value))}"
            path = os.path.expanduser(os.path.expandvars(value))
            exists = "" if os.path.isdir(path) else " - DOES NOT EXIST (an error, no fallback to the Hub)"
            return f"{path} ({origin}){exists}"
    return hub_status(SENTEVAL, file)


def info(names: Sequence[str], revision: str | None, data_dir: str | None) -> None:
    mode = "offline (HF_HUB_OFFLINE)" if is_offline() else f"online ({constants.ENDPOINT})"
    print(f"Hugging Face cache: {constants.HF_HUB_CACHE}; {mode}")
    for name in names:
        file = source_file(name, revision)
        about = SIMCSE_FILES[name][1] if name in SIMCSE_FILES else "Hub file"
        where = senteval_status(data_dir, file) if name == SENTEVAL else hub_status(name, file)
        print(f"{name}: {about}\n  {file}\n  read from: {where}")


def build_parser() -> argparse.ArgumentParser:
    sources = "\n".join(f"  {name:<9} {file}: {about}" for name, (file, about) in SIMCSE_FILES.items())
    epilog = (f"sources (files of {SIMCSE_REPO}):\n{sources}\n"
              "  or any hf://datasets/ORG/NAME[@REVISION]/PATH file\n\n"
              "SentEval data is read from --data-dir / the recipe key sts_data_dir, else $HF_SENTCL_DATA, "
              "else senteval.")
    layout = dict(formatter_class=argparse.RawDescriptionHelpFormatter, epilog=epilog)
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, **layout)
    commands = parser.add_subparsers(dest="command", required=True)
    what = dict(default=",".join(SIMCSE_FILES), help=f"Comma-separated sources (default: {','.join(SIMCSE_FILES)}).")
    revision = dict(default=None, help=f"Branch, tag or commit of {SIMCSE_REPO} (default: main).")
    about = "Fill the Hugging Face cache (HF_HOME) and print where each file lies."
    fetch = commands.add_parser("download", help=about, description=about, **layout)
    fetch.add_argument("--what", **what)
    fetch.add_argument("--revision", **revision)
    fetch.add_argument("--force", action="store_true", help="Download again (and re-extract) even when cached.")
    about = "Say where each source would be read from now; downloads nothing."
    show = commands.add_parser("info", help=about, description=about, **layout)
    show.add_argument("--what", **what)
    show.add_argument("--revision", **revision)
    show.add_argument("--data-dir", default=None, help="As evaluate's --data-dir (it comes before HF_SENTCL_DATA).")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    names = split_commas(args.what)
    try:
        for name in names:
            source_file(name, args.revision)
        if args.command == "download":
            if args.force and is_offline():
                raise ValueError("--force downloads again, which HF_HUB_OFFLINE forbids; unset it.")
            download(names, args.revision, args.force)
        else:
            info(names, args.revision, args.data_dir)
    except (ValueError, HubDataError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
