"""One notion of "offline" for every Hub access: huggingface_hub's own.

huggingface_hub reads `HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`) when it is imported and refuses every request
while it is set, so a downloader or uploader that read the environment again could disagree with what will happen.
"""

from __future__ import annotations

from huggingface_hub import constants


def is_offline() -> bool:
    """Whether huggingface_hub will refuse network requests in this process."""
    return constants.is_offline_mode()
