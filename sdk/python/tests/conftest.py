"""Shared fixtures: the anyio backend for async tests, and the live daemon
(only when scripts/sdk-test.sh or the caller points ZYGOTE_URL at one)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def anyio_backend() -> str:
    # asyncio only: the SDK targets asyncio and trio is not a dependency.
    return "asyncio"


@pytest.fixture(scope="session")
def live_env() -> dict[str, str]:
    """URL and token of the live daemon the suite runs against."""
    url, token = os.environ.get("ZYGOTE_URL"), os.environ.get("ZYGOTE_TOKEN")
    if not url or not token:
        if os.environ.get("ZYGOTE_LIVE_REQUIRED"):
            pytest.fail("ZYGOTE_LIVE_REQUIRED is set but ZYGOTE_URL/ZYGOTE_TOKEN are not")
        pytest.skip("no live zygoted (set ZYGOTE_URL and ZYGOTE_TOKEN, or run scripts/sdk-test.sh)")
    return {"url": url, "token": token}
