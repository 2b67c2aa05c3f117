"""Run a benchmark offline: models and data come from installed packages and local folders.

Call ``go_offline()`` before importing transformers or datasets: they read these once, at import.
"""

import os


def go_offline() -> None:
    for name, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"),
                        ("TOKENIZERS_PARALLELISM", "false"), ("HF_HUB_DISABLE_PROGRESS_BARS", "1")):
        os.environ.setdefault(name, value)
