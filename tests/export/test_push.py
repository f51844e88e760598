"""Pushing an export: the HfApi boundary is replaced by a recorder; nothing here touches the network."""

import hashlib
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import httpx2
import pytest
import torch
from huggingface_hub import constants
from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled, RepositoryNotFoundError

from hf_sentcl import SentenceEncoder
from hf_sentcl.cli.push import main
from hf_sentcl.evaluation.mteb import MtebScores
from hf_sentcl.evaluation.sts import STS_TASKS
from hf_sentcl.export.mteb_files import check_mteb_folder, write_mteb_results
from hf_sentcl.export.publish import publish_run
from hf_sentcl.hub.upload import HubError, check_hub_settings, push_folder, upload_plan
from hf_sentcl.recipe.checks import validate_recipe
from hf_sentcl.recipe.parser import RecipeError, parse_recipe

FAKE_TOKEN = "hf_thisIsNotARealTokenButMustNeverBePrinted"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


class RecordingApi:
    """Stands in for `huggingface_hub.HfApi`: records every call; `fail` makes the named method raise."""

    def __init__(self, fail: dict | None = None):
        self.calls: list[tuple[str, tuple, dict]] = []
        self.fail = fail or {}

    def _record(self, name, args, kwargs):
        self.calls.append((name, args, kwargs))
        if name in self.fail:
            raise self.fail[name]

    def create_repo(self, *args, **kwargs):
        self._record("create_repo", args, kwargs)
        return f"https://huggingface.co/{args[0]}"

    def create_branch(self, *args, **kwargs):
        self._record("create_branch", args, kwargs)

    def upload_folder(self, *args, **kwargs):
        self.card = (Path(kwargs["folder_path"]) / "README.md").read_text()  # what the Hub would receive
        self._record("upload_folder", args, kwargs)
        return SimpleNamespace(commit_url=f"https://huggingface.co/{kwargs['repo_id']}/commit/{COMMIT[:7]}",
                               oid=COMMIT)


def snapshot(folder):
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def http_error(cls, status: int, message: str):
    request = httpx2.Request("POST", "https://huggingface.co/api/repos/create")
    return cls(message, response=httpx2.Response(status, request=request))


def test_push_calls(export_dir):
    api = RecordingApi()
    result = push_folder(export_dir, "my-org/encoder", api=api)
    assert [c[0] for c in api.calls] == ["create_repo", "upload_folder"]
    _, args, kwargs = api.calls[0]
    assert args == ("my-org/encoder",) and kwargs == {"private": None, "repo_type": "model", "exist_ok": True}
    _, args, kwargs = api.calls[1]
    assert kwargs["repo_id"] == "my-org/encoder" and kwargs["folder_path"] == str(export_dir)
    assert kwargs["repo_type"] == "model" and kwargs["revision"] is None and ".git" in kwargs["ignore_patterns"]
    assert not any("token" in key for _, _, kw in api.calls for key in kw)  # huggingface_hub reads the token itself
    assert result.url.endswith("/commit/0123456") and result.commit == COMMIT
    files = [f.path for f in result.files]
    assert {"README.md", "config.json", "modules.json", "model.safetensors", "1_Pooling/config.json"} <= set(files)
    assert not any(f.startswith(".git") for f in files)


def test_cli_private_revision(export_dir, capsys):
    api = RecordingApi()
    code = main([str(export_dir), "--repo-id", "my-org/encoder", "--private", "--revision", "v1",
                 "--commit-message", "first"], api=api)
    assert code == 0
    assert [c[0] for c in api.calls] == ["create_repo", "create_branch", "upload_folder"]
    assert api.calls[0][2]["private"] is True
    assert api.calls[1][1] == ("my-org/encoder",) and api.calls[1][2]["branch"] == "v1"
    assert api.calls[2][2]["revision"] == "v1" and api.calls[2][2]["commit_message"] == "first"
    assert f"Uploaded {len(upload_plan(export_dir))} files to my-org/encoder (branch v1)" in capsys.readouterr().out


def test_dry_run_lists_exactly_the_upload(export_dir, capsys):
    api = RecordingApi()
    before = snapshot(export_dir)
    assert main([str(export_dir), "--repo-id", "my-org/encoder", "--dry-run"], api=api) == 0
    assert api.calls == []
    out = capsys.readouterr().out
    lines = out.splitlines()
    end = next(i for i, line in enumerate(lines) if line.endswith("files)"))
    listed = [line.split()[-1] for line in lines[1:end]]
    assert listed == [f.path for f in upload_plan(export_dir)]
    assert ".git/HEAD" not in out
    # the card is rendered for the repository: its snippets load my-org/encoder
    assert 'SentenceTransformer("my-org/encoder")' in out and 'model_id = "my-org/encoder"' in out
    assert snapshot(export_dir) == before


@pytest.mark.parametrize(
    "failure, message",
    [
        (http_error(HfHubHTTPError, 401, "401 Unauthorized"), "refused the credentials (HTTP 401)"),
        (http_error(RepositoryNotFoundError, 404, "404 Repository Not Found"), "was not found"),
        (httpx2.ConnectError("Name or service not known"), "could not be reached"),
        (OfflineModeIsEnabled("offline"), "HF_HUB_OFFLINE=1"),
    ],
    ids=["auth", "missing-repo", "network", "offline"],
)
def test_hub_errors_end_cleanly(export_dir, capsys, monkeypatch, failure, message):
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    before = snapshot(export_dir)
    api = RecordingApi(fail={"upload_folder": failure})
    assert main([str(export_dir), "--repo-id", "my-org/encoder"], api=api) == 1
    captured = capsys.readouterr()
    assert message in captured.err and "my-org/encoder" in captured.err
    assert "unchanged" in captured.err and "Traceback" not in captured.err
    assert FAKE_TOKEN not in captured.out + captured.err
    assert snapshot(export_dir) == before


def test_bad_inputs(export_dir, tmp_path, capsys):
    """Refused before the Hub is contacted (exit 2, docs/reliability.md): a bad repo id, a folder that is no export,
    an MTEB results folder that is missing."""
    api = RecordingApi()
    assert main([str(export_dir), "--repo-id", "no namespace"], api=api) == 2
    assert "not a valid Hub repository id" in capsys.readouterr().err
    assert main([str(export_dir), "--repo-id", "encoder"], api=api) == 2
    assert "needs a namespace" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty"), "--repo-id", "a/b"], api=api) == 2
    assert "not an hf_sentcl export" in capsys.readouterr().err
    assert main([str(export_dir), "--repo-id", "a/b", "--mteb-results", str(tmp_path / "none")], api=api) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert api.calls == []


def test_push_renders_the_card_for_its_repo_and_files_mteb_results(export_dir, tmp_path, capsys):
    """The uploaded card loads ORG/NAME (the local one is untouched); MTEB files move under the pushed commit."""
    local_card = (export_dir / "README.md").read_text()
    assert 'model_id = "your-username/your-model-name"' in local_card and str(export_dir) not in local_card
    mt = tmp_path / "mt"
    scores = MtebScores({task: 70.0 + i for i, task in enumerate(STS_TASKS)}, {"STS12": 1.5})
    write_mteb_results(mt, scores, name="hf_sentcl/export", export_dir=export_dir, max_tokens=32, embed_dim=32)
    api = RecordingApi()
    assert main([str(export_dir), "--repo-id", "my-org/encoder", "--mteb-results", str(mt)], api=api) == 0
    assert 'SentenceTransformer("my-org/encoder")' in api.card and 'model_id = "my-org/encoder"' in api.card
    captured = capsys.readouterr()
    assert "\n# encoder\n" in api.card and "do not load" not in captured.err
    assert (export_dir / "README.md").read_text() == local_card
    folder = mt / "results" / "my-org__encoder" / COMMIT
    assert sorted(p.parent for p in mt.rglob("model_meta.json")) == [folder]
    assert len(check_mteb_folder(folder)) == 7
    assert json.loads((folder / "model_meta.json").read_text())["revision"] == COMMIT
    # the ModelMeta for mteb's registry is written again for the pushed repository and commit
    module = (mt / "model_meta.py").read_text()
    assert f"revision='{COMMIT}'," in module and "name='my-org/encoder'," in module
    assert "\nmy_org__encoder = ModelMeta(" in module and "hf_sentcl" not in module.split('"""', 2)[2]
    assert f"ModelMeta for mteb's model registry, with that revision: {mt / 'model_meta.py'}" in captured.out
    # a second model folder beside the first (an export written again into the same --mteb-results): which results
    # belong to this push cannot be told, and that is said before the upload, not after it
    shutil.copytree(folder, mt / "results" / "hf_sentcl__export" / "no_revision_available")
    calls = len(api.calls)
    assert main([str(export_dir), "--repo-id", "my-org/encoder", "--mteb-results", str(mt)], api=api) == 2
    assert "should hold exactly one results/ORG__NAME/REVISION/model_meta.json (found 2)" in capsys.readouterr().err
    assert len(api.calls) == calls


def test_a_push_of_a_runs_export_clears_the_push_error_the_run_recorded(export_dir, tmp_path, capsys):
    """The `hf-sentcl push` command a run printed when its own push failed: once it succeeds, the run's
    run_complete.json no longer records the failure (a requeued `auto` run and a sweep then see it complete); a push
    of an export outside a run folder leaves every run_complete.json alone."""
    from hf_sentcl.recipe.run_folder import recorded_failures

    run = tmp_path / "run"
    shutil.copytree(export_dir, run / "export")
    (run / "run_complete.json").write_text(json.dumps({"global_step": 4, "push_error": "HTTP 503, 5 attempts"}))
    assert recorded_failures(run) == {"push_error": "HTTP 503, 5 attempts"}
    assert main([str(run / "export"), "--repo-id", "my-org/encoder"], api=RecordingApi(fail={
        "upload_folder": http_error(HfHubHTTPError, 403, "403 Forbidden")})) == 1
    assert recorded_failures(run) == {"push_error": "HTTP 503, 5 attempts"}  # failed again: still recorded
    assert main([str(run / "export"), "--repo-id", "my-org/encoder"], api=RecordingApi()) == 0
    assert f"The run in {run} is complete now" in capsys.readouterr().out
    assert recorded_failures(run) == {} and json.loads((run / "run_complete.json").read_text()) == {"global_step": 4}


def test_recipe_hub_settings_checked_before_training(tmp_path, monkeypatch, repo_root):
    monkeypatch.setenv("HF_SENTCL_DATA", str(tmp_path))
    train = tmp_path / "train.txt"
    train.write_text("".join(f"sentence {i}\n" for i in range(64)))  # one global batch of the quickstart

    def recipe(*argv):
        return parse_recipe(repo_root / "recipes" / "quickstart.yaml",
                            ["--train_file", str(train), "--output_dir", str(tmp_path / "out"), *argv])

    with pytest.raises(RecipeError, match="hub_model_id is missing"):
        validate_recipe(recipe("--push_to_hub", "true"))
    with pytest.raises(RecipeError, match="HF_HUB_OFFLINE"):
        validate_recipe(recipe("--push_to_hub", "true", "--hub_model_id", "me/enc"))
    with pytest.raises(RecipeError, match="keep tokens out of recipes"):
        validate_recipe(recipe("--hub_token", FAKE_TOKEN))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # what huggingface_hub read at import decides
    monkeypatch.setattr("hf_sentcl.hub.upload.get_token", lambda: None)
    with pytest.raises(HubError, match="no Hugging Face token"):
        check_hub_settings(recipe("--push_to_hub", "true", "--hub_model_id", "me/enc").training)
    monkeypatch.setattr("hf_sentcl.hub.upload.get_token", lambda: FAKE_TOKEN)
    validate_recipe(recipe("--push_to_hub", "true", "--hub_model_id", "me/enc"))


@pytest.mark.slow
def test_publish_run_exports_then_pushes_only_the_export(tiny_bert_dir, tmp_path, capsys, monkeypatch):
    """The end of a recipe run with push_to_hub: export + card in output_dir/export, then one upload of it. MTEB
    result files an earlier run left in output_dir are removed, not filed under this export's commit."""
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="cls", head="mlp").eval()
    (tmp_path / "checkpoint-8").mkdir()  # a training checkpoint beside the export must not be uploaded
    earlier = tmp_path / "mteb_results" / "results" / "hf_sentcl__export" / "no_revision_available"
    earlier.mkdir(parents=True)
    (earlier / "STS12.json").write_text("{}")  # this run has no MTEB-protocol scores
    args = SimpleNamespace(output_dir=str(tmp_path), hub_model_id="me/enc", push_to_hub=True,
                           hub_private_repo=True, hub_revision=None)
    api = RecordingApi()
    info = publish_run(encoder, {"method": "simcse"}, args, api=api)
    assert info == {"path": str(tmp_path / "export"), "pushed_to": "https://huggingface.co/me/enc/commit/0123456"}
    assert not (tmp_path / "mteb_results").exists()
    assert api.calls[0][2]["private"] is True
    assert Path(api.calls[-1][2]["folder_path"]).name == "export" and 'model_id = "me/enc"' in api.card
    assert 'model_id = "me/enc"' in (tmp_path / "export" / "README.md").read_text()

    failing = RecordingApi(fail={"create_repo": http_error(HfHubHTTPError, 403, "403 Forbidden")})
    info = publish_run(encoder, {"method": "simcse"}, args, api=failing)
    assert "HTTP 403" in info["push_error"]
    assert (tmp_path / "export" / "model.safetensors").is_file()  # the export is intact
    err = capsys.readouterr().err
    assert "hf-sentcl push" in err and FAKE_TOKEN not in err
    assert json.loads((tmp_path / "export" / "modules.json").read_text())[1]["path"] == "1_Pooling"


def test_publish_run_of_a_diverged_model_writes_nothing(tiny_bert_dir, tmp_path, capsys):
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean").eval()
    with torch.no_grad():
        encoder.backbone.embeddings.word_embeddings.weight.fill_(float("nan"))
    args = SimpleNamespace(output_dir=str(tmp_path), hub_model_id=None, push_to_hub=False)
    info = publish_run(encoder, {"method": "simcse", "mteb_sts": {"STS12": 70.0}}, args)
    assert "non-finite weights" in info["export_error"] and "non-finite weights" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no export, no card, no MTEB files
