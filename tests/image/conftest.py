"""Fixtures for the tests against the live image (run by docker/test_image.sh).

WORKBENCH_TEST_IMAGE names the image; without it (a plain `pytest` run) these tests
are skipped: docker/test_image.sh builds the image and runs them, and scripts/test.sh
runs that script. How the containers are started: image_helpers.py.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest
from image_helpers import IMAGE, UID, Lab, Labs, offline_model_mounts


@pytest.fixture(scope="session", autouse=True)
def _needs_the_image():
    if not IMAGE:
        pytest.skip("needs a built image: run `bash docker/test_image.sh` (scripts/test.sh does)")


@pytest.fixture(scope="session")
def token_file(_needs_the_image, tmp_path_factory) -> tuple[Path, str]:
    """A 32-byte token in a file of mode 600 owned by the image's user, as docs/image.md says."""
    token = secrets.token_urlsafe(32)
    path = tmp_path_factory.mktemp("secret") / "jupyter_token"
    path.write_text(token)
    path.chmod(0o600)
    os.chown(path, UID, UID)
    path.parent.chmod(0o755)
    return path, token


@pytest.fixture(scope="session")
def labs(token_file):
    labs = Labs(*token_file)
    yield labs
    labs.close()


@pytest.fixture(scope="session")
def lab(labs) -> Lab:
    """The container most checks share (they do not change it), with the offline test models."""
    return labs.start(extra=offline_model_mounts())


@pytest.fixture
def fresh_labs(_needs_the_image, token_file):
    """Containers on volumes of their own, for checks that stop, restart or break things."""
    labs = Labs(*token_file)
    yield labs
    labs.close()
