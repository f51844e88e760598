"""The boundary to the Hugging Face Hub: upload an export folder with `huggingface_hub` (create_repo, upload_folder).

Everything that talks to the Hub goes through an `HfApi`-like object passed as `api` (tests pass a recorder).
The token is never taken as an argument, logged or written: `huggingface_hub` reads it from `HF_TOKEN` or from
`hf auth login`. Hub failures (authentication, missing repository or revision, network, offline mode) become a
`HubError` whose message says what to do; nothing local is changed by a push.

Transient failures are retried with exponential backoff. Transient: a connection refused, reset or closed without an
answer, a timeout, HTTP 408, 429 and 5xx (not 501). Everything else fails at once: HTTP 401/403/404 and other 4xx,
offline mode, no token, a host name that does not exist. Three environment variables set the retries:

    HF_SENTCL_PUSH_ATTEMPTS   attempts in all, at least 1 (default 5; 1 turns retrying off)
    HF_SENTCL_PUSH_BACKOFF_S  seconds before the 2nd attempt, doubled before each later one, capped at 60 s
                              (default 2: about 2, 4, 8, 16 s); each wait is drawn within +-25 % (jitter), and an
                              answer's `Retry-After` (seconds, up to 60) is waited at least
    HF_SENTCL_PUSH_TIMEOUT_S  seconds a request of the push waits for each step of the exchange: connecting, sending a
                              piece of the body, each read of the answer (default 60, more than 0)

huggingface_hub's shared HTTP client has no timeout (`timeout=None`), and some of its calls pass `timeout=None`
themselves, so a Hub that accepts the connection and never answers would hold a push forever. While a push runs, the
client is built with a request hook that gives every request without a bound the push timeout (a bound a call sets
itself is kept); the timeout is then a transient failure like the others. The client is shared by the process: a
download running in another thread during a push gets the bound too, and the client is rebuilt (its pooled
connections closed) when the push starts and ends.

Each retry is logged as a warning on the `hf_sentcl` logger with the attempt, the wait and the error. When the
attempts are spent, the `HubError` names the repository, the number of attempts, the last error and the
`hf-sentcl push EXPORT --repo-id ORG/NAME` command that tries again (the export folder is never changed).

An attempt is the whole push again, and repeating it is safe: `create_repo(exist_ok=True)`, `create_branch(
exist_ok=True)`, then `upload_folder` as one commit (an export has a few files; huggingface_hub splits only folders
of over 256 files into several commits). A commit that landed although its answer was lost (a 5xx or a reset after
the Hub applied it) can be sent twice: a new attempt here first asks the Hub which files differ (preupload), finds
none and makes no commit (the result's commit is then the branch head); huggingface_hub's own retry of the commit
request sends it again as is, which makes a second commit with identical files. The repository's files are the
export's either way. huggingface_hub retries its preupload and commit requests itself (5 retries, waits of 1 to 8 s)
within one attempt; create_repo, create_branch and the README check (validate-yaml) are retried only here.
"""

from __future__ import annotations

import logging
import math
import os
import random
import shlex
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from huggingface_hub import HfApi, get_token, set_client_factory
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
from huggingface_hub.utils import _http as hub_http

from hf_sentcl.hub.offline import is_offline

#: what every hf_sentcl export holds: the backbone's config, the card and the card's inputs. modules.json is not among
#: them: an export that sentence-transformers cannot reproduce (PromptBERT's prompt pooling) is an AutoModel one only
REQUIRED_EXPORT_FILES = ("config.json", "README.md", "hf_sentcl_card.json")

#: files of an export that stay local: `hf_sentcl_card.json` (hf_sentcl.export.results.CARD_INPUTS), the plan and
#: results its card was rendered from, which name local paths (the base model's folder, the run's files)
LOCAL_ONLY_FILES = ("hf_sentcl_card.json",)

ATTEMPTS_ENV = "HF_SENTCL_PUSH_ATTEMPTS"
BACKOFF_ENV = "HF_SENTCL_PUSH_BACKOFF_S"
TIMEOUT_ENV = "HF_SENTCL_PUSH_TIMEOUT_S"
DEFAULT_ATTEMPTS = 5
DEFAULT_BACKOFF_S = 2.0
#: a commit of a few files is answered in seconds; a minute of silence is a Hub that will not answer
DEFAULT_TIMEOUT_S = 60.0
#: no wait between two attempts is longer (Retry-After included)
MAX_BACKOFF_S = 60.0
#: each wait is drawn within +-JITTER of its nominal value
JITTER = 0.25
#: HTTP answers worth another attempt: timeout, too many requests, server errors (501 Not Implemented is not)
TRANSIENT_STATUS = frozenset({408, 429}) | (frozenset(range(500, 600)) - {501})
#: the transport errors of huggingface_hub's HTTP client (httpx, or httpx2 for huggingface_hub 2), matched by class
#: name so that either works: timeouts, network errors (refused, reset), a server that closed without an answer
TRANSIENT_TRANSPORT_ERRORS = frozenset({"TimeoutException", "NetworkError", "RemoteProtocolError"})
#: getaddrinfo's answer for a name that does not exist (retrying does not make it exist)
_NO_SUCH_HOST = ("Name or service not known", "nodename nor servname provided", "No address associated with hostname")

logger = logging.getLogger("hf_sentcl")


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
    """Fail before training when a push at the end could not work: bad repo id, bad retry settings, offline mode,
    or no token."""
    check_repo_id(repo_id, key)
    push_retry_settings()  # a bad HF_SENTCL_PUSH_ATTEMPTS/BACKOFF_S fails now, not after training
    push_timeout()  # and a bad HF_SENTCL_PUSH_TIMEOUT_S
    if is_offline():
        raise HubError("push_to_hub is set but HF_HUB_OFFLINE=1: pushing needs the network. Unset HF_HUB_OFFLINE.")
    if get_token() is None:
        raise HubError(
            "push_to_hub is set but no Hugging Face token was found: run `hf auth login` or set HF_TOKEN "
            "(never put the token in the recipe)."
        )


def ignore_patterns() -> list[str]:
    """What an upload leaves out: huggingface_hub's default ignores (.git, .cache, ...) and `LOCAL_ONLY_FILES`."""
    return [*DEFAULT_IGNORE_PATTERNS, *LOCAL_ONLY_FILES]


def upload_plan(folder: str | Path) -> list[UploadFile]:
    """Exactly the files `upload_folder` sends from `folder`: every file, minus `ignore_patterns()`."""
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
    kept = filter_repo_objects(list(files), ignore_patterns=ignore_patterns())
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


def push_retry_settings() -> tuple[int, float]:
    """The attempts and the first wait in seconds, from `HF_SENTCL_PUSH_ATTEMPTS` and `HF_SENTCL_PUSH_BACKOFF_S`."""
    raw = os.environ.get(ATTEMPTS_ENV, "").strip()
    try:
        attempts = int(raw) if raw else DEFAULT_ATTEMPTS
    except ValueError:
        attempts = 0
    if attempts < 1:
        raise HubError(f"{ATTEMPTS_ENV}='{raw}' must be a whole number of at least 1 (attempts in all; 1: no retry).")
    raw = os.environ.get(BACKOFF_ENV, "").strip()
    try:
        backoff = float(raw) if raw else DEFAULT_BACKOFF_S
    except ValueError:
        backoff = -1.0
    if not (math.isfinite(backoff) and backoff >= 0):
        raise HubError(f"{BACKOFF_ENV}='{raw}' must be a number of seconds, 0 or more (the wait before attempt 2).")
    return attempts, backoff


def push_timeout() -> float:
    """Seconds each step of a push's HTTP requests may wait (connect, send, each read): `HF_SENTCL_PUSH_TIMEOUT_S`."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    try:
        timeout = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        timeout = 0.0
    if not (math.isfinite(timeout) and timeout > 0):
        raise HubError(f"{TIMEOUT_ENV}='{raw}' must be a number of seconds, more than 0 (how long a request of a push "
                       "waits for the Hub).")
    return timeout


def _bound_request_hook(timeout: float) -> Callable[[Any], None]:
    """An httpx request hook that gives each unbounded part of a request's timeout (connect, read, write, pool) the
    bound `timeout`; a bound the caller set is kept. The transport reads the request's `timeout` extension after the
    hooks ran, so this reaches requests sent with `timeout=None` too."""

    def bound(request: Any) -> None:
        given = request.extensions.get("timeout") or {}
        parts = {name: given.get(name) for name in ("connect", "read", "write", "pool")}
        request.extensions = {**request.extensions,
                              "timeout": {name: timeout if value is None else value for name, value in parts.items()}}

    return bound


@contextmanager
def bounded_hub_requests(timeout: float) -> Iterator[None]:
    """While the block runs, every request of huggingface_hub's shared client waits at most `timeout` seconds per
    step: its client factory is wrapped to add `_bound_request_hook` (huggingface_hub rebuilds the client from the
    factory after a connection error), and the previous factory is put back afterwards."""
    previous = getattr(hub_http, "_GLOBAL_CLIENT_FACTORY", hub_http.default_client_factory)
    hook = _bound_request_hook(timeout)

    def bounded_client() -> Any:
        client = previous()
        hooks = client.event_hooks
        client.event_hooks = {**hooks, "request": [*hooks.get("request", []), hook]}
        return client

    set_client_factory(bounded_client)  # closes the shared client: the next request builds a bounded one
    try:
        yield
    finally:
        set_client_factory(previous)


def _no_such_host(err: BaseException) -> bool:
    """Whether `err` (or what caused it) says the host name does not exist: no retry makes it exist."""
    seen: BaseException | None = err
    for _ in range(8):  # the cause chain of an httpx error: ConnectError <- httpcore's <- socket.gaierror
        if seen is None:
            return False
        if isinstance(seen, socket.gaierror) and seen.errno == socket.EAI_NONAME:
            return True
        if any(text in str(seen) for text in _NO_SUCH_HOST):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def is_transient(err: BaseException) -> bool:
    """Whether another attempt may succeed: refused/reset connections, timeouts, HTTP 408, 429 and 5xx (not 501).
    Offline mode, a missing token, HTTP 4xx (401, 403, 404, ...) and a host name that does not exist are not."""
    if isinstance(err, (OfflineModeIsEnabled, LocalTokenNotFoundError)):  # a ConnectionError and an OSError
        return False
    if isinstance(err, HfHubHTTPError):
        return getattr(getattr(err, "response", None), "status_code", None) in TRANSIENT_STATUS
    transport = any(cls.__name__ in TRANSIENT_TRANSPORT_ERRORS for cls in type(err).__mro__)
    if transport or isinstance(err, (ConnectionError, TimeoutError)):
        return not _no_such_host(err)
    return False


def retry_wait(attempt: int, backoff: float, err: BaseException) -> float:
    """Seconds to wait after failed attempt `attempt` (1-based): `backoff` doubled per attempt, capped, with jitter;
    at least the Hub's `Retry-After` (seconds) when it sent one."""
    wait = min(backoff * 2 ** (attempt - 1), MAX_BACKOFF_S) * random.uniform(1 - JITTER, 1 + JITTER)
    headers = getattr(getattr(err, "response", None), "headers", None) or {}
    retry_after = str(headers.get("retry-after", "")).strip()
    if retry_after.isdigit():
        wait = max(wait, min(float(retry_after), MAX_BACKOFF_S))
    return min(wait, MAX_BACKOFF_S)


def short_error(err: BaseException) -> str:
    """`Type: first line` of an error, for a log line."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def push_command(
    folder: str | Path,
    repo_id: str,
    *,
    revision: str | None = None,
    private: bool | None = None,
    commit_message: str | None = None,
    mteb_results: str | Path | None = None,
) -> str:
    """The `hf-sentcl push` command line that pushes the export `folder` as asked (for a message; shell-quoted)."""
    argv = ["hf-sentcl", "push", str(folder), "--repo-id", repo_id]
    if mteb_results is not None:
        argv += ["--mteb-results", str(mteb_results)]
    if private:
        argv.append("--private")
    if revision:
        argv += ["--revision", revision]
    if commit_message:
        argv += ["--commit-message", commit_message]
    return shlex.join(argv)


def push_folder(
    folder: str | Path,
    repo_id: str,
    *,
    private: bool | None = None,
    revision: str | None = None,
    commit_message: str | None = None,
    api: HubApi | None = None,
    retry_command: str | None = None,
) -> PushResult:
    """Create the model repository if needed (and the branch `revision`), then upload `folder` in one commit;
    transient failures are retried (module docstring), others raise `HubError` at once.

    `private=None` keeps the Hub's default for a new repository (an existing repository keeps its visibility).
    `retry_command`: the command a failure message gives for trying again (default: `push_command(folder, ...)`;
    `hf-sentcl push` uploads a copy of the export, and names the export itself).
    """
    check_repo_id(repo_id)
    files = upload_plan(folder)
    attempts, backoff = push_retry_settings()
    timeout = push_timeout()
    api = api if api is not None else HfApi()
    message = commit_message or f"Upload sentence encoder exported by hf_sentcl ({len(files)} files)"
    with bounded_hub_requests(timeout):
        for attempt in range(1, attempts + 1):
            try:
                info = _push_once(api, folder, repo_id, private=private, revision=revision, commit_message=message)
                break
            except (hub_errors.HTTPError, OSError) as err:  # HTTP answers, transport failures, offline mode, no token
                if not is_transient(err):
                    raise HubError(describe_hub_error(err, repo_id, revision)) from None
                if attempt == attempts:
                    retry = retry_command or push_command(folder, repo_id, revision=revision, private=private,
                                                          commit_message=commit_message)
                    raise HubError(attempts_ran_out(err, repo_id, revision, attempts, timeout, retry)) from None
                wait = retry_wait(attempt, backoff, err)
                logger.warning("Push to '%s': attempt %d of %d failed (%s); retrying in %.3g s.",
                               repo_id, attempt, attempts, short_error(err), wait)
                time.sleep(wait)
    url = getattr(info, "commit_url", None) or f"https://huggingface.co/{repo_id}"
    commit = getattr(info, "oid", None)
    return PushResult(repo_id=repo_id, revision=revision, url=url, files=tuple(files), commit=commit)


def attempts_ran_out(err: BaseException, repo_id: str, revision: str | None, attempts: int, timeout: float,
                     retry: str) -> str:
    """The message of a push whose attempts are spent: the repository, the attempts, the last error (for a timeout,
    the bound and its variable) and the command that pushes the export again."""
    last = describe_hub_error(err, repo_id, revision).rstrip(".")
    if any(cls.__name__ == "TimeoutException" for cls in type(err).__mro__) or isinstance(err, TimeoutError):
        where = f"'{repo_id}'" + (f" (revision '{revision}')" if revision else "")
        last = (f"Cannot push to {where}: the Hub did not answer within {timeout:g} s ({short_error(err)}; "
                f"{TIMEOUT_ENV} sets that bound)")
    return (
        f"Push to '{repo_id}' failed after {attempts} attempt{'s' if attempts > 1 else ''} "
        f"({ATTEMPTS_ENV}={attempts}); the last error: {last}. Nothing local was changed; push the "
        f"export again with `{retry}`."
    )


def _push_once(api: HubApi, folder: str | Path, repo_id: str, *, private: bool | None, revision: str | None,
               commit_message: str) -> Any:
    """One attempt, safe to repeat: the repository and branch are created only if missing, the upload is one commit
    (files the Hub already has unchanged are not committed again)."""
    api.create_repo(repo_id, private=private, repo_type="model", exist_ok=True)
    if revision and revision != "main":
        api.create_branch(repo_id, branch=revision, repo_type="model", exist_ok=True)
    return api.upload_folder(
        repo_id=repo_id,
        folder_path=str(folder),
        commit_message=commit_message,
        repo_type="model",
        revision=revision,
        ignore_patterns=ignore_patterns(),
    )


def format_upload_plan(files: Sequence[UploadFile]) -> str:
    """A listing of an upload, one `size  path` line per file and a total."""
    lines = [f"{f.size:>12,d}  {f.path}" for f in files]
    lines.append(f"{sum(f.size for f in files):>12,d}  total ({len(files)} files)")
    return "\n".join(lines)
