"""The zygote's side: programs run as `python3 -I -S -c` would, and the host framing."""

import os

import pytest

from verifiers.sandbox import runner as sandbox
from verifiers.sandbox.runner import SandboxConfig, run_python
from verifiers.sandbox.worker import read_frame, send_frame

FAST = SandboxConfig(timeout_s=5.0, cpu_s=5)


@pytest.fixture(scope="module", autouse=True)
def _fresh_pool():
    yield
    sandbox.shutdown()


def test_frames_round_trip_bytes_exactly():
    r, w = os.pipe()
    blob = bytes(range(256)) * 10
    send_frame(w, {"status": "ok", "n": 1}, blob, b"")
    os.close(w)
    assert read_frame(r) == ({"status": "ok", "n": 1}, blob, b"")
    assert read_frame(r) is None  # clean end of stream
    os.close(r)


def test_an_oversized_or_cut_frame_is_refused():
    r, w = os.pipe()
    send_frame(w, {}, b"x" * 5000)
    with pytest.raises(ValueError, match="exceeds"):
        read_frame(r, max_bytes=1000)
    os.close(r), os.close(w)
    r, w = os.pipe()
    os.write(w, b"\0\0\0\x10\0\0\0\0\0\0\0\0{")  # promises 16 header bytes, sends 1
    os.close(w)
    with pytest.raises(ValueError, match="inside a frame"):
        read_frame(r)
    os.close(r)


def test_runs_like_python_dash_c():
    result = run_python("import sys\nprint(input().upper())\nprint('err', file=sys.stderr)\nsys.exit(3)",
                        stdin="hello\n", config=FAST)
    assert (result.status, result.exit_code, result.stdout, result.stderr) == ("ok", 3, "HELLO\n", "err\n")
    assert not result.output_truncated and result.duration_ms > 0


def test_uncaught_exception_and_syntax_error_are_exit_1_with_traceback():
    crash = run_python("def f():\n    1/0\nf()", config=FAST)
    assert crash.status == "ok" and crash.exit_code == 1
    assert crash.stderr.startswith("Traceback") and "ZeroDivisionError" in crash.stderr
    assert "_exec_main" not in crash.stderr  # the harness's frame is not shown
    syntax = run_python("def (", config=FAST)
    assert syntax.exit_code == 1 and "SyntaxError" in syntax.stderr


def test_threads_atexit_and_buffered_output_finish_like_an_interpreter_exit():
    result = run_python(
        "import atexit, sys, threading, time\n"
        "atexit.register(lambda: print('atexit ran'))\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread done'))).start()\n"
        "sys.stdout.write('no newline, still flushed')\n", config=FAST)
    assert result.exit_code == 0
    assert result.stdout == "no newline, still flushedthread done\natexit ran\n"

