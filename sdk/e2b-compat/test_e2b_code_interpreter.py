"""E2B's code interpreter (issue 37): the UNCHANGED `e2b-code-interpreter` SDK against zygote.

`Sandbox.create()` of `e2b_code_interpreter` asks for template `code-interpreter-v1`, which
zygote maps to its `code-interpreter` image (guest/rootfs/recipes/code-interpreter.recipe;
scripts/e2b-test.sh builds it first). The SDK talks to port 49999 of the sandbox at
E2B_SANDBOX_URL with E2B's routing headers; the daemon answers there itself, on top of
the native code interpreter (crates/daemon/src/e2b/codeint.rs), reaching the guest's
kernels through its agent.
"""
import base64
import struct

import pytest
from e2b import TimeoutException
from e2b.exceptions import NotFoundException as CoreNotFound
from e2b_code_interpreter import Sandbox


@pytest.fixture(scope="module")
def sbx():
    s = Sandbox.create(timeout=900, metadata={"suite": "e2b-compat"})
    try:
        yield s
    finally:
        s.kill()


def test_template_and_state_across_run_code(sbx):
    assert sbx.get_info().template_id in ("code-interpreter-v1", "code-interpreter")
    out = []
    first = sbx.run_code("x = 1\nprint('hi')\nx", on_stdout=lambda m: out.append(m.line))
    assert first.error is None, first.error
    assert first.logs.stdout == ["hi\n"]
    assert out == ["hi\n"]
    assert first.text == "1"
    second = sbx.run_code("x += 1; x")
    assert second.text == "2"
    assert second.execution_count > first.execution_count


def test_errors_come_back_as_execution_errors(sbx):
    ex = sbx.run_code("1 / 0")
    assert ex.error is not None
    assert ex.error.name == "ZeroDivisionError"
    assert "division by zero" in ex.error.value
    assert "ZeroDivisionError" in ex.error.traceback


def test_a_matplotlib_chart_is_a_png(sbx):
    results = []
    ex = sbx.run_code(
        "import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [3, 5])\nplt.show()",
        on_result=results.append,
    )
    assert ex.error is None, ex.error
    pngs = [r.png for r in ex.results if r.png]
    assert len(pngs) == 1 and len(results) == len(ex.results)
    raw = base64.b64decode(pngs[0])
    assert raw[:8] == b"\x89PNG\r\n\x1a\n" and raw[12:16] == b"IHDR"
    width, height = struct.unpack(">II", raw[16:24])
    assert width > 100 and height > 100


def test_rich_results_keep_their_formats(sbx):
    ex = sbx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
    assert ex.error is None, ex.error
    main = [r for r in ex.results if r.is_main_result]
    assert len(main) == 1 and main[0].html and "<table" in main[0].html
    assert "a" in main[0].text


def test_contexts_are_independent_kernels(sbx):
    ctx = sbx.create_code_context()
    assert ctx.language == "python" and ctx.cwd
    assert sbx.run_code("y = 7", context=ctx).error is None
    assert sbx.run_code("y", context=ctx).text == "7"
    assert sbx.run_code("'y' in dir()").text == "False"
    assert ctx.id in [c.id for c in sbx.list_code_contexts()]
    sbx.restart_code_context(ctx)
    assert sbx.run_code("'y' in dir()", context=ctx).text == "False"
    sbx.remove_code_context(ctx)
    assert ctx.id not in [c.id for c in sbx.list_code_contexts()]
    with pytest.raises(CoreNotFound):
        sbx.run_code("1", context=ctx)


def test_the_sdk_timeout_interrupts_and_the_state_stays(sbx):
    sbx.run_code("z = 5")
    with pytest.raises(TimeoutException):
        sbx.run_code("import time\ntime.sleep(600)", timeout=3)
    # The kernel was interrupted when the SDK gave up: the next cell runs at once.
    assert sbx.run_code("z", timeout=120).text == "5"


def test_envs_hold_for_one_execution(sbx):
    show = "import os; print(os.environ.get('ZYG_E2B'))"
    ex = sbx.run_code(show, envs={"ZYG_E2B": "1"})
    assert ex.error is None, ex.error
    assert ex.logs.stdout == ["1\n"]
    assert sbx.run_code(show).logs.stdout == ["None\n"]
    failed = sbx.run_code("raise ValueError(os.environ['ZYG_E2B'])", envs={"ZYG_E2B": "boom"})
    assert failed.error is not None and failed.error.name == "ValueError"
    assert failed.error.value == "boom"
    assert sbx.run_code(show).logs.stdout == ["None\n"]
