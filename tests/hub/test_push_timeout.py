"""A push to a Hub that accepts the connection and never answers times out, is retried, and ends in the "attempts ran
out" error with the `hf-sentcl push` command; it never hangs.

The silent Hub is a listening socket on 127.0.0.1 whose thread accepts connections and holds them without reading or
writing a byte. Offline mode is lifted for these tests only and huggingface_hub's default endpoint points at that
socket (nothing can reach the real Hub).
"""

import socket
import threading
import time
from collections.abc import Iterator

import httpx2
import pytest
from fake_hub import TOKEN
from huggingface_hub import HfApi, close_session, constants
from huggingface_hub.utils import _http as hub_http

from hf_sentcl.cli.push import main
from hf_sentcl.export.publish import push_export
from hf_sentcl.hub.upload import (
    ATTEMPTS_ENV,
    BACKOFF_ENV,
    DEFAULT_TIMEOUT_S,
    TIMEOUT_ENV,
    HubError,
    bounded_hub_requests,
    check_push_possible,
    push_timeout,
)

REPO = "my-org/encoder"
#: a push of 2 attempts with a 1 s timeout takes about 2 s; anything near this bound is a hang
BOUND_S = 30.0


class SilentHub:
    """A server that accepts every connection and never answers (nor closes it) until the test ends."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.connections: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="silent-hub", daemon=True)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            self.connections.append(conn)  # held open, never read nor written

    def __enter__(self) -> "SilentHub":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for conn in [*self.connections, self._listener]:
            conn.close()


@pytest.fixture
def silent_hub(monkeypatch) -> Iterator[SilentHub]:
    """Offline mode lifted, no telemetry, a fake token, the default endpoint on a silent Hub; 2 attempts 10 ms apart,
    each request bounded at 1 s."""
    with SilentHub() as hub:
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        monkeypatch.setenv(ATTEMPTS_ENV, "2")
        monkeypatch.setenv(BACKOFF_ENV, "0.01")
        monkeypatch.setenv(TIMEOUT_ENV, "1")
        yield hub
        close_session()  # no pooled connection to the silent Hub outlives the test


def run_bounded(target, bound: float = BOUND_S):
    """Run `target()` in a thread; fail the test (instead of hanging it) when it has not ended after `bound` s.
    Returns (its result or the exception it raised, seconds taken)."""
    outcome: dict = {}

    def call() -> None:
        try:
            outcome["value"] = target()
        except BaseException as err:  # handed to the test
            outcome["value"] = err

    start = time.monotonic()
    thread = threading.Thread(target=call, name="push-under-test", daemon=True)
    thread.start()
    thread.join(bound)
    assert not thread.is_alive(), f"the push still runs after {bound} s: it hangs on a Hub that never answers"
    return outcome["value"], time.monotonic() - start


def test_a_hub_that_never_answers_times_out_and_is_retried(silent_hub, export_dir):
    """push_export: each attempt's first request times out after 1 s, the attempt is retried, then the HubError
    names the repository, the attempts, the timeout and its variable, and the command that pushes again."""
    failed, took = run_bounded(lambda: push_export(export_dir, REPO, api=HfApi(endpoint=silent_hub.url, token=TOKEN)))
    assert isinstance(failed, HubError), failed
    message = str(failed)
    assert f"Push to '{REPO}' failed after 2 attempts ({ATTEMPTS_ENV}=2)" in message
    assert "did not answer within 1 s" in message and "Timeout" in message and TIMEOUT_ENV in message
    assert f"`hf-sentcl push {export_dir} --repo-id {REPO}`" in message
    assert len(silent_hub.connections) == 2  # one per attempt: create_repo, which huggingface_hub does not retry
    assert took < BOUND_S


def test_hf_sentcl_push_against_a_silent_hub_exits_1(silent_hub, export_dir, capsys):
    """`hf-sentcl push` (its own HfApi: endpoint and HF_TOKEN) ends with exit 1 and the error line, not a hang."""
    status, _ = run_bounded(lambda: main([str(export_dir), "--repo-id", REPO]))
    assert status == 1
    err = capsys.readouterr().err
    assert "error:" in err and "failed after 2 attempts" in err and "did not answer within 1 s" in err


def test_requests_sent_with_timeout_none_are_bounded(silent_hub):
    """Inside `bounded_hub_requests` a request huggingface_hub sends with `timeout=None` (model_info's default) times
    out too; a bound the caller gives is kept; afterwards the previous client factory is back."""
    before = hub_http._GLOBAL_CLIENT_FACTORY
    api = HfApi(endpoint=silent_hub.url, token=TOKEN)
    with bounded_hub_requests(0.5):
        failed, took = run_bounded(lambda: api.model_info(REPO, timeout=None))
        assert isinstance(failed, httpx2.ReadTimeout) and took < 5, (failed, took)
        failed, took = run_bounded(lambda: api.model_info(REPO, timeout=2.0))
        assert isinstance(failed, httpx2.ReadTimeout) and 1.9 < took < 10, (failed, took)  # the caller's 2 s
    assert hub_http._GLOBAL_CLIENT_FACTORY is before


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "soon"])
def test_push_timeout_setting(monkeypatch, bad):
    """Default 60 s; a positive number of seconds is taken; anything else is refused naming the variable, before
    training (check_push_possible) as before a push."""
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    assert push_timeout() == DEFAULT_TIMEOUT_S == 60.0
    monkeypatch.setenv(TIMEOUT_ENV, "2.5")
    assert push_timeout() == 2.5
    monkeypatch.setenv(TIMEOUT_ENV, bad)
    with pytest.raises(HubError, match=f"{TIMEOUT_ENV}='{bad}'"):
        push_timeout()
    with pytest.raises(HubError, match=f"{TIMEOUT_ENV}='{bad}'"):
        check_push_possible(REPO)
