"""Downloading and uploading agree on "offline": both follow what huggingface_hub itself will refuse, not a second
reading of the environment."""

import pytest
from huggingface_hub import constants

from hf_sentcl.hub.download import HubDataError, HubFile, hub_file_path
from hf_sentcl.hub.offline import is_offline
from hf_sentcl.hub.upload import HubError, check_push_possible


@pytest.mark.parametrize("hub_offline, environment", [(True, "0"), (False, "1")])
def test_upload_and_download_follow_huggingface_hub(monkeypatch, tmp_path, hub_offline, environment):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", hub_offline)
    monkeypatch.setenv("HF_HUB_OFFLINE", environment)  # read again by nobody: huggingface_hub read it at import
    monkeypatch.setattr("hf_sentcl.hub.upload.get_token", lambda: "hf_token_for_the_test")
    assert is_offline() is hub_offline
    if hub_offline:
        with pytest.raises(HubError, match="HF_HUB_OFFLINE"):
            check_push_possible("org/name")
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
        with pytest.raises(HubDataError, match="HF_HUB_OFFLINE is set"):
            hub_file_path(HubFile.parse("hf://datasets/org/data/file.txt"), "train_file")
    else:
        check_push_possible("org/name")  # no offline refusal although the environment says 1
