"""A push retries transient Hub failures (HTTP 5xx/429, connection resets) and fails at once on the others.

The Hub is `fake_hub.FakeHub`, a local HTTP server on 127.0.0.1 spoken to by a real `huggingface_hub.HfApi`: the
requests a push makes are the real ones. Offline mode is lifted for these tests only, huggingface_hub's default
endpoint points at a closed local port (nothing can reach the real Hub) and its telemetry is off.
"""

import hashlib
import logging
import shlex
from pathlib import Path
from types import SimpleNamespace

import httpx2
import pytest
from fake_hub import RESET, TOKEN, FakeHub
from huggingface_hub import HfApi, close_session, constants
from huggingface_hub.errors import HfHubHTTPError, LocalTokenNotFoundError, OfflineModeIsEnabled

from hf_sentcl import SentenceEncoder
from hf_sentcl.cli.push import main
from hf_sentcl.export.publish import publish_run, push_export
from hf_sentcl.hub.offline import is_offline
from hf_sentcl.hub.upload import (
    ATTEMPTS_ENV,
    BACKOFF_ENV,
    MAX_BACKOFF_S,
    HubError,
    is_transient,
    push_retry_settings,
    retry_wait,
    upload_plan,
)

ATTEMPTS = 4
REPO = "my-org/encoder"
#: what the client reports for a reset connection, depending on when it notices
RESET_SEEN_AS = ("Connection reset", "disconnected without sending a response", "Broken pipe")
#: a local port nothing listens on: where huggingface_hub's default endpoint points during these tests
NOWHERE = "http://127.0.0.1:9"


@pytest.fixture
def online(monkeypatch):
    """Offline mode lifted (what huggingface_hub read at import decides), no telemetry, the default endpoint on a
    closed local port, a fake token, and tiny backoff: 4 attempts, 10 ms doubling."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)  # no agent-registry fetch in the user agent
    monkeypatch.setattr(constants, "ENDPOINT", NOWHERE)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv(ATTEMPTS_ENV, str(ATTEMPTS))
    monkeypatch.setenv(BACKOFF_ENV, "0.01")
    assert not is_offline()
    yield monkeypatch
    close_session()  # no pooled connection to a stopped fake Hub outlives the test


def snapshot(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def api_for(hub: FakeHub) -> HfApi:
    return HfApi(endpoint=hub.url, token=TOKEN)


def step(path: str) -> str:
    """The Hub API call a request path is: create, branch, validate-yaml, preupload, commit, revision."""
    parts = path.split("?")[0].split("/")
    return parts[-2] if path.startswith("/api/models/") else parts[-1]


def creates(hub: FakeHub) -> list[str]:
    """What each create_repo request got ("ok", "409", "503", "reset", ...)."""
    return [got for method, path, got in hub.requests if path == "/api/repos/create"]


def assert_commit_is_the_export(hub: FakeHub, export_dir: Path, repo_id: str = REPO) -> None:
    """One commit, holding exactly the export's files (those upload_folder sends), byte for byte; the model card
    rendered for `repo_id`."""
    assert len(hub.commits) == 1 and hub.commits[0].repo_id == repo_id
    files = hub.commits[0].files
    assert sorted(files) == sorted(f.path for f in upload_plan(export_dir))
    assert {"config.json", "modules.json", "model.safetensors", "1_Pooling/config.json"} <= set(files)
    for name, content in files.items():
        if name != "README.md":
            assert content == (export_dir / name).read_bytes(), name
    assert f'model_id = "{repo_id}"' in files["README.md"].decode()
    assert hub.unexpected == []


@pytest.mark.parametrize(
    "failures", [(503, 503), (429,), (RESET, 502)], ids=["503-twice", "429", "reset-then-502"],
)
def test_transient_failures_are_retried(online, export_dir, caplog, failures):
    """The first requests fail; the push starts again and succeeds; each retry is logged with attempt, wait, error."""
    with FakeHub(fail_next=failures) as hub, caplog.at_level(logging.WARNING, logger="hf_sentcl"):
        online.setattr(constants, "ENDPOINT", hub.url)
        result, _ = push_export(export_dir, REPO, api=api_for(hub))
    assert creates(hub) == [str(f) for f in failures] + ["ok"]  # one create_repo per attempt
    assert [got for _, _, got in hub.requests[len(failures):]] == ["ok"] * 4  # create, validate-yaml, preupload, commit
    assert_commit_is_the_export(hub, export_dir)
    assert result.commit == hub.commits[0].oid
    retries = [r.getMessage() for r in caplog.records if r.name == "hf_sentcl" and r.levelno == logging.WARNING]
    assert len(retries) == len(failures)
    for attempt, (line, failure) in enumerate(zip(retries, failures), start=1):
        assert f"'{REPO}': attempt {attempt} of {ATTEMPTS} failed" in line and "retrying in" in line
        # a reset is seen as such, or as a server that closed without answering, depending on timing
        assert any(text in line for text in ([str(failure)] if failure != RESET else RESET_SEEN_AS))
    assert TOKEN not in caplog.text


def test_resets_exhaust_the_attempts_then_the_given_command_pushes(online, export_dir, capsys):
    """A Hub that resets every connection: HubError after the configured attempts naming the repository, the last
    error and the command to retry; the export is untouched; that command then pushes to a working Hub."""
    before = snapshot(export_dir)
    with FakeHub(always=RESET) as hub:
        online.setattr(constants, "ENDPOINT", hub.url)
        with pytest.raises(HubError) as failed:
            push_export(export_dir, REPO, api=api_for(hub))
    assert creates(hub) == [RESET] * ATTEMPTS and hub.commits == []
    message = str(failed.value)
    assert f"Push to '{REPO}' failed after {ATTEMPTS} attempts" in message
    assert "could not be reached" in message and any(text in message for text in RESET_SEEN_AS)
    command = message.split("`")[-2]
    assert command == f"hf-sentcl push {export_dir} --repo-id {REPO}"
    assert snapshot(export_dir) == before

    argv = shlex.split(command)
    assert argv[:2] == ["hf-sentcl", "push"]
    with FakeHub() as hub:
        online.setattr(constants, "ENDPOINT", hub.url)  # `hf-sentcl push` builds its own HfApi(): endpoint + HF_TOKEN
        assert main(argv[2:]) == 0
    assert f"to {REPO}: {hub.url}/{REPO}/commit/{hub.commits[0].oid}" in capsys.readouterr().out
    assert_commit_is_the_export(hub, export_dir)
    assert snapshot(export_dir) == before


def test_a_retry_repeats_the_whole_push_safely(online, export_dir):
    """An attempt that failed after creating the repository and the branch is repeated whole: create_repo and
    create_branch find them (409, exist_ok) and the upload is one commit; pushing once more commits nothing."""
    with FakeHub(fail_next=[None, None, 503]) as hub:  # create_repo, create_branch, then README check: 503
        online.setattr(constants, "ENDPOINT", hub.url)
        argv = [str(export_dir), "--repo-id", REPO, "--revision", "v1"]
        assert main(argv) == 0
        first = [(step(path), got) for _, path, got in hub.requests]
        assert first == [("create", "ok"), ("branch", "ok"), ("validate-yaml", "503"),  # attempt 1
                         ("create", "409"), ("branch", "409"), ("validate-yaml", "ok"), ("preupload", "ok"),
                         ("commit", "ok")]
        assert [c.revision for c in hub.commits] == ["v1"]
        assert_commit_is_the_export(hub, export_dir)
        assert main(argv) == 0  # the same push again: the Hub has every file unchanged, no second commit
        assert len(hub.commits) == 1 and hub.requests[-1][:2] == ("GET", f"/api/models/{REPO}/revision/v1")
    assert hub.unexpected == []


@pytest.mark.parametrize(
    "failure, message", [(401, "HTTP 401"), (403, "HTTP 403"), (404, "HTTP 404"), ("offline", "HF_HUB_OFFLINE=1")],
)
def test_other_failures_are_not_retried(online, export_dir, caplog, failure, message):
    """Refused credentials, a missing repository and offline mode fail on the first attempt."""
    with FakeHub(fail_next=[] if failure == "offline" else [failure]) as hub:
        online.setattr(constants, "ENDPOINT", hub.url)
        if failure == "offline":
            online.setattr(constants, "HF_HUB_OFFLINE", True)
        with pytest.raises(HubError, match=message) as failed:
            push_export(export_dir, REPO, api=api_for(hub))
    assert creates(hub) == ([] if failure == "offline" else [str(failure)])  # 403: then a repo_info, no new attempt
    assert "attempt" not in str(failed.value) and hub.commits == []
    assert not [r for r in caplog.records if r.name == "hf_sentcl" and "attempt" in r.getMessage()]


def test_publish_run_push_error_names_the_retry_command(online, tiny_bert_dir, tmp_path, capsys):
    """The push at the end of a run: a Hub that stays down is reported under push_error with the command that pushes
    the (intact) export again, as is a refused push."""
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean").eval()
    args = SimpleNamespace(output_dir=str(tmp_path), hub_model_id="me/enc", push_to_hub=True,
                           hub_private_repo=True, hub_revision=None)
    command = f"hf-sentcl push {tmp_path / 'export'} --repo-id me/enc --private"
    with FakeHub(always=503) as hub:
        online.setattr(constants, "ENDPOINT", hub.url)
        info = publish_run(encoder, {"method": "simcse"}, args, api=api_for(hub))
    assert creates(hub) == ["503"] * ATTEMPTS
    assert f"failed after {ATTEMPTS} attempts" in info["push_error"] and "HTTP 503" in info["push_error"]
    assert info["push_error"].count(command) == 1 and command in capsys.readouterr().err
    assert (tmp_path / "export" / "model.safetensors").is_file()

    with FakeHub(fail_next=[403]) as hub:
        online.setattr(constants, "ENDPOINT", hub.url)
        info = publish_run(encoder, {"method": "simcse"}, args, api=api_for(hub))
    assert "HTTP 403" in info["push_error"] and command in info["push_error"] and creates(hub) == ["403"]


def response_error(status: int, headers: dict | None = None) -> HfHubHTTPError:
    request = httpx2.Request("POST", "https://huggingface.co/api/repos/create")
    return HfHubHTTPError(f"{status}", response=httpx2.Response(status, request=request, headers=headers))


def error_id(err: Exception) -> str:
    if isinstance(err, HfHubHTTPError):
        return f"http-{err.response.status_code}"
    errno = str(err).split("]")[0].removeprefix("[Errno ") if str(err).startswith("[Errno") else ""
    return f"{type(err).__name__}{errno}"


@pytest.mark.parametrize(
    "err, transient",
    [
        (response_error(500), True), (response_error(502), True), (response_error(503), True),
        (response_error(504), True), (response_error(429), True), (response_error(408), True),
        (httpx2.ConnectError("[Errno 111] Connection refused"), True),
        (httpx2.ReadError("[Errno 104] Connection reset by peer"), True),
        (httpx2.ReadTimeout("timed out"), True),
        (httpx2.RemoteProtocolError("Server disconnected without sending a response."), True),
        (ConnectionResetError(104, "Connection reset by peer"), True), (TimeoutError("timed out"), True),
        (httpx2.ConnectError("[Errno -3] Temporary failure in name resolution"), True),
        (response_error(400), False), (response_error(401), False), (response_error(403), False),
        (response_error(404), False), (response_error(501), False),
        (OfflineModeIsEnabled("offline"), False), (LocalTokenNotFoundError("no token"), False),
        (httpx2.ConnectError("[Errno -2] Name or service not known"), False),
        (FileNotFoundError("export"), False), (ValueError("bad yaml"), False),
    ],
    ids=lambda value: error_id(value) if isinstance(value, Exception) else None,
)
def test_which_errors_are_transient(err, transient):
    """Only failures that may go away by themselves are worth another attempt."""
    assert is_transient(err) is transient


def test_retry_settings_and_waits(monkeypatch):
    monkeypatch.delenv(ATTEMPTS_ENV, raising=False)
    monkeypatch.delenv(BACKOFF_ENV, raising=False)
    assert push_retry_settings() == (5, 2.0)
    monkeypatch.setenv(ATTEMPTS_ENV, "1")
    monkeypatch.setenv(BACKOFF_ENV, "0")
    assert push_retry_settings() == (1, 0.0)
    for name, bad in [(ATTEMPTS_ENV, "0"), (ATTEMPTS_ENV, "three"), (BACKOFF_ENV, "-1"), (BACKOFF_ENV, "nan")]:
        monkeypatch.setenv(name, bad)
        with pytest.raises(HubError, match=f"{name}='{bad}'"):
            push_retry_settings()
        monkeypatch.delenv(name)
    reset = httpx2.ReadError("reset")
    for attempt, nominal in [(1, 2.0), (2, 4.0), (3, 8.0), (4, 16.0)]:  # doubling, jitter within 25 %
        waits = [retry_wait(attempt, 2.0, reset) for _ in range(50)]
        assert all(0.75 * nominal <= w <= 1.25 * nominal for w in waits) and len(set(waits)) > 1
    assert max(retry_wait(10, 2.0, reset) for _ in range(50)) <= MAX_BACKOFF_S  # capped
    assert retry_wait(1, 0.01, response_error(429, {"Retry-After": "7"})) == 7.0  # the Hub's wait, at least
    assert retry_wait(1, 0.01, response_error(503, {"Retry-After": "3600"})) == MAX_BACKOFF_S
