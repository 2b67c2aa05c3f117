"""The Hugging Face Hub's offline switch, read in one place.

``huggingface_hub`` decides at import time from ``HF_HUB_OFFLINE`` (and accepts
1/true/yes/on); whatever it decided is what every download will do, so that is
the answer the workbench's messages give too, never a second reading of the
environment with other rules.
"""

from __future__ import annotations

OFFLINE_FIX = ("offline mode (HF_HUB_OFFLINE=1) only finds cached models and local folders: "
               "download it once where the hub is reachable (`hf download NAME`) or pass a local folder")


def is_offline() -> bool:
    """True when the hub is switched off for this process (HF_HUB_OFFLINE)."""
    try:
        from huggingface_hub import is_offline_mode
    except ImportError:  # huggingface_hub older than 0.3x: its constant
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    return bool(is_offline_mode())
