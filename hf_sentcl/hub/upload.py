"""The boundary to the Hugging Face Hub: upload an export folder with `huggingface_hub` (create_repo, upload_folder).

Everything that talks to the Hub goes through an `HfApi`-like object passed as `api` (tests pass a recorder).
The token is never taken as an argument, logged or written: `huggingface_hub` reads it from `HF_TOKEN` or from
`hf auth login`. Hub failures (authentication, missing repository or revision, network, offline mode) become a
`HubError` whose message says what to do; nothing local is changed by a push.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from huggingface_hub import HfApi, get_token
from huggingface_hub import errors as hub_errors
from huggingface_hub.errors import (
    HfHubHTTPError,
    HFValidationError,
    LocalTokenNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import DEFAULT_IGNORE_PATTERNS, filter_repo_objects, validate_repo_id

from hf_sentcl.hub.offline import is_offline

REQUIRED_EXPORT_FILES = ("config.json", "modules.json", "README.md")


class HubError(RuntimeError):
    """A push that could not be done; the message names the repository and the fix."""


class HubApi(Protocol):
    """The part of `huggingface_hub.HfApi` a push uses."""

    def create_repo(self, repo_id: str, *, private: bool | None = None, repo_type: str | None = None,
                    exist_ok: bool = False) -> Any: ...

    def create_branch(self, repo_id: str, *, branch: str, repo_type: str | None = None,
                      exist_ok: bool = False) -> None: ...

    def upload_folder(self, *, repo_id: str, folder_path: str | Path, commit_message: str | None = None,
                      repo_type: str | None = None, revision: str | None = None,
                      ignore_patterns: list[str] | None = None) -> Any: ...


@dataclass(frozen=True)
class UploadFile:
    """One file of an upload: its path in the repository and its size in bytes."""

    path: str
    size: int


@dataclass(frozen=True)
class PushResult:
    repo_id: str
    revision: str | None
    url: str | None
    files: tuple[UploadFile, ...]
    #: the commit the upload made (`CommitInfo.oid`): the model revision MTEB results are filed under
    commit: str | None = None


def check_repo_id(repo_id: str | None, key: str = "--repo-id") -> str:
    """Return `repo_id` if it is a valid `ORG/NAME` Hub id, else raise `HubError` naming `key`."""
    if not repo_id:
        raise HubError(f"{key} is missing: give the Hub repository as ORG/NAME.")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise HubError(f"{key} '{repo_id}' is not a valid Hub repository id: {err}") from None
    if "/" not in repo_id:
        raise HubError(f"{key} '{repo_id}' needs a namespace: write ORG/NAME (your user name or an organisation).")
    return repo_id


def check_hub_settings(args) -> None:
    """Check a recipe's Hub settings before training: no `hub_token` in recipes; a push must be able to work."""
    if getattr(args, "hub_token", None):
        raise HubError("key 'hub_token': keep tokens out of recipes (they are saved with checkpoints); use HF_TOKEN "
                       "or `hf auth login`.")
    if args.push_to_hub:
        check_push_possible(args.hub_model_id)


def check_push_possible(repo_id: str | None, key: str = "hub_model_id") -> None:
    """Fail before training when a push at the end could not work: bad repo id, offline mode, or no token."""
    check_repo_id(repo_id, key)
    if is_offline():
        raise HubError("push_to_hub is set but HF_HUB_OFFLINE=1: pushing needs the network. Unset HF_HUB_OFFLINE.")
    if get_token() is None:
        raise HubError(
            "push_to_hub is set but no Hugging Face token was found: run `hf auth login` or set HF_TOKEN "
            "(never put the token in the recipe)."
        )


def upload_plan(folder: str | Path) -> list[UploadFile]:
    """Exactly the files `upload_folder` sends from `folder`: every file, minus huggingface_hub's default ignores."""
    folder = Path(folder)
    if not folder.is_dir():
        raise HubError(f"Export folder '{folder}' does not exist.")
    missing = [name for name in REQUIRED_EXPORT_FILES if not (folder / name).is_file()]
    if missing:
        raise HubError(
            f"'{folder}' is not an hf_sentcl export (missing {', '.join(missing)}); create one with "
            "`hf-sentcl export CHECKPOINT OUT` and push OUT."
        )
    files = {p.relative_to(folder).as_posix(): p for p in sorted(folder.glob("**/*")) if p.is_file()}
    kept = filter_repo_objects(list(files), ignore_patterns=list(DEFAULT_IGNORE_PATTERNS))
    return [UploadFile(path, files[path].stat().st_size) for path in kept]


def describe_hub_error(err: Exception, repo_id: str, revision: str | None) -> str:
    """A one-paragraph explanation of a Hub failure (no token or request headers are included)."""
    where = f"'{repo_id}'" + (f" (revision '{revision}')" if revision else "")
    if isinstance(err, OfflineModeIsEnabled):
        return f"Cannot push to {where}: HF_HUB_OFFLINE=1 is set. Unset it to push."
    if isinstance(err, LocalTokenNotFoundError):
        return f"Cannot push to {where}: no Hugging Face token. Run `hf auth login` or set HF_TOKEN."
    if isinstance(err, RevisionNotFoundError):
        return f"Cannot push to {where}: the revision does not exist on the Hub and could not be created."
    if isinstance(err, RepositoryNotFoundError):
        return (
            f"Cannot push to {where}: the repository was not found or your token cannot see it. Check the "
            "ORG/NAME spelling and that your token has write access to that namespace."
        )
    if isinstance(err, HfHubHTTPError):
        status = getattr(getattr(err, "response", None), "status_code", None)
        if status in (401, 403):
            return (
                f"Cannot push to {where}: the Hub refused the credentials (HTTP {status}). Log in again with "
                "`hf auth login` using a token with write access, or set HF_TOKEN."
            )
        detail = err.server_message or str(err).splitlines()[0]
        return f"Cannot push to {where}: the Hub answered HTTP {status}: {detail}"
    if isinstance(err, (hub_errors.HTTPError, ConnectionError, TimeoutError)):
        return f"Cannot push to {where}: the Hub could not be reached ({type(err).__name__}: {err}). Check the network."
    return f"Cannot push to {where}: {type(err).__name__}: {err}"


def push_folder(
    folder: str | Path,
    repo_id: str,
    *,
    private: bool | None = None,
    revision: str | None = None,
    commit_message: str | None = None,
    api: HubApi | None = None,
) -> PushResult:
    """Create the model repository if needed (and the branch `revision`), then upload `folder` in one commit.

    `private=None` keeps the Hub's default for a new repository (an existing repository keeps its visibility).
    """
    check_repo_id(repo_id)
    files = upload_plan(folder)
    api = api if api is not None else HfApi()
    try:
        api.create_repo(repo_id, private=private, repo_type="model", exist_ok=True)
        if revision and revision != "main":
            api.create_branch(repo_id, branch=revision, repo_type="model", exist_ok=True)
        info = api.upload_folder(
            repo_id=repo_id,
            folder_path=str(folder),
            commit_message=commit_message or f"Upload sentence encoder exported by hf_sentcl ({len(files)} files)",
            repo_type="model",
            revision=revision,
            ignore_patterns=list(DEFAULT_IGNORE_PATTERNS),
        )
    except (hub_errors.HTTPError, OSError) as err:  # HTTP answers, transport failures, offline mode, no token
        raise HubError(describe_hub_error(err, repo_id, revision)) from None
    url = getattr(info, "commit_url", None) or f"https://huggingface.co/{repo_id}"
    commit = getattr(info, "oid", None)
    return PushResult(repo_id=repo_id, revision=revision, url=url, files=tuple(files), commit=commit)


def format_upload_plan(files: Sequence[UploadFile]) -> str:
    """A listing of an upload, one `size  path` line per file and a total."""
    lines = [f"{f.size:>12,d}  {f.path}" for f in files]
    lines.append(f"{sum(f.size for f in files):>12,d}  total ({len(files)} files)")
    return "\n".join(lines)
