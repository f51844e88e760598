"""Data files from the Hugging Face Hub: `hf://datasets/ORG/NAME[@REVISION]/PATH` and the SentEval archive.

Every file is fetched with `huggingface_hub.hf_hub_download`, so the standard cache and its settings apply
(`HF_HOME`, `HF_HUB_CACHE`, `HF_HUB_OFFLINE`, `HF_ENDPOINT`, tokens, revisions); a cached file is read offline.
`datasets`' own `hf://` support lists the repository through the Hub API first, which fails offline.

The SentEval archive (`senteval.tar` of `princeton-nlp/datasets-for-simcse`, the downstream data SimCSE's scripts
fetch) is extracted once per revision into huggingface_hub's assets cache, atomically: into a temporary sibling
folder, then renamed, under a file lock, so neither an interrupted extraction nor a second process ever sees a
folder that looks complete but is not.
"""

from __future__ import annotations

import logging
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import quote, unquote

from filelock import FileLock
from huggingface_hub import cached_assets_path, constants, hf_hub_download, try_to_load_from_cache
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import repo_folder_name
from huggingface_hub.utils import validate_repo_id

from hf_sentcl.hub.offline import is_offline

DATA_ENV_VAR = "HF_SENTCL_DATA"


def resolve_data_dir(data_dir: str | os.PathLike | None) -> Path:
    """Return the SentEval-format data directory (the folder that holds STS/, SICK/, MR/, ...).

    In this order: `data_dir` (`--data-dir`, recipe key `sts_data_dir`), else `HF_SENTCL_DATA`, else the SentEval
    archive of the Hub (`princeton-nlp/datasets-for-simcse`, `senteval.tar`), read from the Hugging Face cache or
    downloaded, and extracted once. A local value must be an existing folder; an `hf://datasets/...` value names
    another archive (e.g. a pinned revision). Raises FileNotFoundError saying how to provide the data.
    """
    value = data_dir if data_dir not in (None, "") else os.environ.get(DATA_ENV_VAR) or None
    if value is None:
        return senteval_from_hub()
    if is_hub_uri(str(value)):
        try:
            archive = HubFile.parse(str(value))
        except ValueError as err:
            raise FileNotFoundError(f"SentEval data: {err}") from None
        return senteval_from_hub(archive)
    path = Path(os.path.expandvars(str(value))).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(
            f"SentEval data directory '{path}' does not exist. Point {DATA_ENV_VAR} or --data-dir at the folder "
            "that holds STS/, SICK/, MR/, ..., or set neither to use the Hub's SentEval archive."
        )
    return path


logger = logging.getLogger(__name__)


URI_PREFIX = "hf://"


DATASET_URI_PREFIX = "hf://datasets/"


URI_SYNTAX = "hf://datasets/ORG/NAME[@REVISION]/PATH"


SIMCSE_REPO = "princeton-nlp/datasets-for-simcse"


LIBRARY_NAME = "hf_sentcl"  # the assets-cache folder of extracted archives


#: a SentEval-format data folder holds these task folders (STS/ and SICK/ at least)
SENTEVAL_TASK_DIRS = ("STS", "SICK")


INCOMPLETE_SUFFIX = ".incomplete"


class HubDataError(FileNotFoundError):
    """Data that cannot be had: not cached while offline, missing on the Hub, or a damaged archive.

    A FileNotFoundError, so the CLIs report it like a missing local file (message, exit code 2).
    """


@dataclass(frozen=True)
class HubFile:
    """One file of a Hub dataset repository, at a revision (None: the default branch)."""

    repo_id: str
    filename: str
    revision: str | None = None

    @classmethod
    def parse(cls, uri: str) -> HubFile:
        """Read `hf://datasets/ORG/NAME[@REVISION]/PATH`; raise ValueError naming the URI and the syntax."""
        if not uri.startswith(DATASET_URI_PREFIX):
            raise ValueError(f"'{uri}': only dataset files are supported, as {URI_SYNTAX}.")
        parts = uri[len(DATASET_URI_PREFIX):].split("/", 2)
        if len(parts) < 3 or not parts[2].strip("/"):
            raise ValueError(f"'{uri}' names no file; write {URI_SYNTAX}.")
        name, _, revision = parts[1].partition("@")
        repo_id = f"{parts[0]}/{name}"
        try:
            validate_repo_id(repo_id)
        except HFValidationError as err:
            raise ValueError(f"'{uri}': '{repo_id}' is not a valid repository id ({err}).") from None
        # a revision with '/' (refs/pr/1) is written URL-encoded, as huggingface_hub's HfFileSystem does
        return cls(repo_id, parts[2].strip("/"), unquote(revision) if revision else None)

    @property
    def uri(self) -> str:
        revision = f"@{quote(self.revision, safe='')}" if self.revision else ""
        return f"{DATASET_URI_PREFIX}{self.repo_id}{revision}/{self.filename}"

    def __str__(self) -> str:
        return self.uri


SENTEVAL_ARCHIVE = HubFile(SIMCSE_REPO, "senteval.tar")


#: the files of SimCSE's data repository, by the short names `hf-sentcl data` takes
SIMCSE_FILES = {
    "senteval": ("senteval.tar", "SentEval evaluation data (STS, SICK, transfer tasks), extracted once"),
    "wiki1m": ("wiki1m_for_simcse.txt", "unsupervised training corpus: 10^6 Wikipedia sentences, one per line"),
    "nli": ("nli_for_simcse.csv", "supervised SimCSE triplets from SNLI+MNLI: columns sent0, sent1, hard_neg"),
}


def is_hub_uri(value: object) -> bool:
    """Whether `value` is an `hf://` address (rather than a local path or a `datasets` id)."""
    return isinstance(value, str) and value.startswith(URI_PREFIX)


def hub_file_path(file: HubFile, what: str, force: bool = False, hint: str | None = None) -> Path:
    """The local path of `file` in the Hugging Face cache, downloaded first when needed and allowed.

    `what` names the setting or source the file came from, `hint` what to do when it is not cached and cannot be
    downloaded (default: prefetch it or give a local file), both for the error message.
    """
    try:
        local = hf_hub_download(
            file.repo_id, file.filename, repo_type="dataset", revision=file.revision, force_download=force
        )
    except LocalEntryNotFoundError:
        reason = "HF_HUB_OFFLINE is set" if is_offline() else "the Hub could not be reached"
        if hint is None:
            hint = (f"Fetch it once on a machine with network and the same HF_HOME (hf-sentcl data download "
                    f"--what {file}), or give a local file instead.")
        raise HubDataError(
            f"{what}: '{file}' is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and {reason}. {hint}"
        ) from None
    except (RepositoryNotFoundError, GatedRepoError, RevisionNotFoundError, EntryNotFoundError) as err:
        raise HubDataError(
            f"{what}: '{file}' does not exist on the Hub or is not accessible ({type(err).__name__}); check the "
            "repository, revision and path (private or gated repositories need `hf auth login` or HF_TOKEN)."
        ) from None
    except HfHubHTTPError as err:
        raise HubDataError(f"{what}: downloading '{file}' failed: {err}") from None
    return Path(local)


def cached_hub_file(file: HubFile) -> Path | None:
    """The cached copy of `file`, or None; never touches the network."""
    found = try_to_load_from_cache(file.repo_id, file.filename, revision=file.revision, repo_type="dataset")
    return Path(found) if isinstance(found, str) else None


def snapshot_revision(local: Path, filename: str) -> str:
    """The commit hash of a cached file: its path is `.../snapshots/<commit>/<filename>`."""
    return local.parents[len(PurePosixPath(filename).parts) - 1].name


def extraction_dir(file: HubFile, revision: str) -> Path:
    """Where the archive `file` at commit `revision` is extracted: huggingface_hub's assets cache, one folder
    per repository, revision and archive name."""
    namespace = repo_folder_name(repo_id=file.repo_id, repo_type="dataset")
    # assets_dir given: cached_assets_path's default is the value HF_ASSETS_CACHE had when huggingface_hub loaded
    assets = cached_assets_path(LIBRARY_NAME, namespace, revision, assets_dir=constants.HF_ASSETS_CACHE)
    return assets / PurePosixPath(file.filename).name.split(".")[0]


def is_senteval_dir(path: Path) -> bool:
    return all((path / name).is_dir() for name in SENTEVAL_TASK_DIRS)


def senteval_root(folder: Path, archive: Path) -> Path:
    """The folder that holds STS/, SICK/, ...: `folder` itself or the one folder that wraps them."""
    if is_senteval_dir(folder):
        return folder
    entries = [p for p in folder.iterdir() if not p.name.startswith((".", "__MACOSX"))]
    if len(entries) == 1 and entries[0].is_dir() and is_senteval_dir(entries[0]):
        return entries[0]
    raise HubDataError(
        f"The archive '{archive}' holds neither the SentEval task folders ({', '.join(SENTEVAL_TASK_DIRS)}, ...) "
        f"at its top level nor one folder that wraps them (it holds {sorted(p.name for p in entries)[:8]})."
    )


def extract_once(archive: Path, target: Path, source: str) -> Path:
    """Extract the SentEval `archive` into `target` unless that folder exists; return `target`.

    Under a file lock (one extracting process at a time; the others then find the folder), into a temporary
    sibling folder renamed to `target` only when complete. A damaged or truncated archive raises HubDataError
    naming it and leaves nothing behind; `source` is the archive's Hub address, for the message.
    """
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if target.is_dir():  # another process finished it while this one waited
            return target
        for stale in target.parent.glob(f".{target.name}-*{INCOMPLETE_SUFFIX}"):  # left by a killed extraction
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", suffix=INCOMPLETE_SUFFIX, dir=target.parent))
        try:
            logger.info("Extracting %s into %s", archive, target)
            try:
                with tarfile.open(archive) as tar:
                    tar.extractall(staging, filter="data")  # no absolute paths, links out or device files
            except (tarfile.TarError, EOFError, ValueError) as err:
                reason = " ".join(str(err).split())  # tarfile lists every compression it tried, one per line
                raise HubDataError(
                    f"The SentEval archive '{archive}' ({source}) cannot be extracted: {reason}. It is truncated or "
                    f"damaged; download it again: hf-sentcl data download --what senteval --force"
                ) from None
            os.rename(senteval_root(staging, archive), target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


#: (hub cache, archive URI) -> extracted folder, so one process asks the Hub once, not once per task file
_extracted: dict[tuple[str, str], Path] = {}


def senteval_from_hub(archive: HubFile = SENTEVAL_ARCHIVE, force: bool = False) -> Path:
    """The SentEval data folder from the Hub archive: downloaded (or read from the cache) and extracted once."""
    key = (constants.HF_HUB_CACHE, archive.uri)
    if not force and key in _extracted and _extracted[key].is_dir():
        return _extracted[key]
    try:
        local = hub_file_path(archive, "SentEval data", force=force, hint="")
    except HubDataError as err:
        raise HubDataError(no_senteval_message(archive, str(err).strip())) from None
    target = extraction_dir(archive, snapshot_revision(local, archive.filename))
    if force and target.is_dir():
        shutil.rmtree(target)
    _extracted[key] = extract_once(local, target, archive.uri)
    return _extracted[key]


def no_senteval_message(archive: HubFile, reason: str) -> str:
    """The error when no SentEval data can be found, naming the three ways to provide it."""
    what = "senteval" if archive == SENTEVAL_ARCHIVE else archive.uri
    return (
        "No SentEval data (the folder with STS/, SICK/, MR/, ...). Provide it in one of three ways: "
        "(1) --data-dir DIR or the recipe key 'sts_data_dir'; "
        "(2) the environment variable HF_SENTCL_DATA=DIR; "
        f"(3) the Hub archive {archive}, fetched into the Hugging Face cache "
        f"(`hf-sentcl data download --what {what}` on a machine with network, then HF_HUB_OFFLINE=1 "
        f"works). This time: {reason}"
    )
