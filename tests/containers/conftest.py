"""The container image fixture: the image ``.ci/run`` builds, or a skip (a failure under CI=true)."""

from __future__ import annotations

import pytest

from tests.containers import _podman


@pytest.fixture(scope="session")
def image() -> str:
    problem = _podman.image_problem()
    if problem is not None:
        if _podman.in_ci():
            pytest.fail(f"CI=true but the container image is not usable: {problem}; {_podman.HOW_TO_BUILD}",
                        pytrace=False)
        pytest.skip(f"no container image: {problem}; {_podman.HOW_TO_BUILD}")
    return _podman.IMAGE
