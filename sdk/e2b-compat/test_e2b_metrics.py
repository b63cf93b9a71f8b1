"""E2B's Python SDK, unchanged (e2b==2.63.0): sandbox metrics (issue 35).

`Sandbox.get_metrics(start, end)` (instance and class form, sync and async) reads
zygote's native time series (the daemon samples every running sandbox's agent every
few seconds); `GET /sandboxes/metrics?sandbox_ids=` and envd's `GET /metrics` are
checked over raw HTTP against the SDK's own generated models. Run by
scripts/e2b-test.sh (see test_e2b_python.py for the variables).
"""
import asyncio
import datetime
import email.utils
import os
import time

import httpx
import pytest
from e2b import AsyncSandbox, Sandbox
from e2b.api.client.models.sandbox_metric import SandboxMetric
from e2b.api.client.models.sandboxes_with_metrics import SandboxesWithMetrics
from e2b.exceptions import SandboxException

TEMPLATE = os.environ.get("E2B_TEST_TEMPLATE", "base")
API = os.environ["E2B_API_URL"]
KEY = {"X-API-Key": os.environ["E2B_API_KEY"]}
# The daemon samples every 5 s unless told otherwise (--metrics-interval).
WAIT = 60


@pytest.fixture(scope="module")
def sbx():
    s = Sandbox.create(template=TEMPLATE, timeout=600, metadata={"suite": "e2b-metrics"})
    yield s
    s.kill()


def first_samples(sbx):
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        got = sbx.get_metrics()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"no metrics within {WAIT} s")


def test_get_metrics_answers_samples_with_their_fields(sbx):
    got = first_samples(sbx)
    last = got[-1]
    assert isinstance(last.timestamp, datetime.datetime) and last.timestamp.tzinfo is not None
    assert abs((datetime.datetime.now(datetime.timezone.utc) - last.timestamp).total_seconds()) < 120
    assert last.cpu_count >= 1 and 0.0 <= last.cpu_used_pct <= 100.0
    assert 0 < last.mem_used <= last.mem_total and 0 <= last.mem_cache <= last.mem_total
    assert 0 < last.disk_used <= last.disk_total
    assert [m.timestamp for m in got] == sorted(m.timestamp for m in got)
    # The class form, and the time range (unix seconds on the wire, inclusive).
    assert Sandbox.get_metrics(sbx.sandbox_id)[: len(got)] == got
    one = sbx.get_metrics(start=last.timestamp, end=last.timestamp)
    assert one and all(m.timestamp == last.timestamp for m in one)
    assert sbx.get_metrics(end=datetime.datetime(2001, 1, 1, tzinfo=datetime.timezone.utc)) == []


def test_get_metrics_of_an_unknown_sandbox_is_not_found():
    with pytest.raises(SandboxException, match="not found"):
        Sandbox.get_metrics("sb-000000000000")


def test_bad_ranges_are_400s(sbx):
    for query, says in [("start=soon", "start"), ("start=10&end=5", "must not be after end")]:
        r = httpx.get(f"{API}/sandboxes/{sbx.sandbox_id}/metrics?{query}", headers=KEY)
        assert r.status_code == 400, (query, r.text)
        assert r.json()["code"] == 400 and says in r.json()["message"], r.text


def test_async_get_metrics(sbx):
    first_samples(sbx)

    async def run():
        a = await AsyncSandbox.connect(sbx.sandbox_id)
        return await a.get_metrics()

    got = asyncio.run(run())
    assert got and got[-1].cpu_count >= 1


def test_batch_metrics_answer_each_sandboxs_newest_sample(sbx):
    first_samples(sbx)
    r = httpx.get(f"{API}/sandboxes/metrics", params={"sandbox_ids": f"{sbx.sandbox_id},sb-000000000000"}, headers=KEY)
    assert r.status_code == 200, r.text
    parsed = SandboxesWithMetrics.from_dict(r.json())
    assert list(parsed.sandboxes) == [sbx.sandbox_id]
    newest = SandboxMetric.from_dict(parsed.sandboxes[sbx.sandbox_id])
    assert newest.timestamp_unix >= int(sbx.get_metrics()[0].timestamp.timestamp())
    missing = httpx.get(f"{API}/sandboxes/metrics", headers=KEY)
    assert missing.status_code == 400 and "sandbox_ids" in missing.json()["message"]
    many = ",".join(f"sb-{i:012d}" for i in range(101))
    too_many = httpx.get(f"{API}/sandboxes/metrics", params={"sandbox_ids": many}, headers=KEY)
    assert too_many.status_code == 400 and "maximum is 100" in too_many.json()["message"]


def daemon_now() -> int:
    """The daemon's clock (its HTTP Date header, whole seconds): samples are stamped on
    it, and it need not be this host's (the nested lane's daemon runs in a VM)."""
    r = httpx.get(f"{API}/sandboxes", headers=KEY)
    return int(email.utils.parsedate_to_datetime(r.headers["date"]).timestamp())


def test_envd_metrics_is_a_sample_taken_now(sbx):
    headers = {
        "E2b-Sandbox-Id": sbx.sandbox_id,
        "E2b-Sandbox-Port": "49983",
        "X-Access-Token": sbx._envd_access_token,
    }
    before = daemon_now()
    r = httpx.get(f"{sbx.envd_api_url}/metrics", headers=headers)
    assert r.status_code == 200, r.text
    m = r.json()
    assert set(m) == {"ts", "cpu_count", "cpu_used_pct", "mem_total", "mem_used", "mem_cache",
                      "mem_total_mib", "mem_used_mib", "disk_used", "disk_total"}
    assert m["ts"] >= before and m["cpu_count"] >= 1
    assert m["mem_total_mib"] == m["mem_total"] >> 20 and m["mem_used"] <= m["mem_total"]
    assert 0 < m["disk_used"] <= m["disk_total"]
    # Without the token: envd's 401.
    del headers["X-Access-Token"]
    assert httpx.get(f"{sbx.envd_api_url}/metrics", headers=headers).status_code == 401
