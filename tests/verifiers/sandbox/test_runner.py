"""The sandbox against real attacks: each test checks the verdict and that the host is
unharmed (no file outside the work dir, no process left behind, back within its timeout).

"No process left behind" is checked as: the test process's descendants after the run are
exactly those before it (the warm worker's own processes). That also proves the attack
did not kill or replace the worker.
"""

import os
import socket
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from verifiers.sandbox import runner as sandbox
from verifiers.sandbox.runner import RunResult, SandboxConfig, SandboxUnavailable, run_python

FAST = SandboxConfig(timeout_s=2.0, cpu_s=2)


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def run_checked(source: str, config: SandboxConfig = FAST, *, within_s: float | None = None, **kw) -> RunResult:
    """Run on a warm worker; assert it returned in time and left no process behind."""
    run_python("pass", config=config)  # warm the worker the attack will land on
    before = _descendants()
    started = time.monotonic()
    result = run_python(source, config=config, **kw)
    elapsed = time.monotonic() - started
    assert elapsed < (within_s if within_s is not None else config.timeout_s + 3), (elapsed, result)
    assert _descendants() == before, f"processes left behind or worker replaced: {result}"
    return result


@pytest.fixture(scope="module", autouse=True)
def _fresh_pool():
    yield
    sandbox.shutdown()


@pytest.fixture
def listener():
    """A real TCP server on host loopback that records every connection it accepts."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    accepted: list = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                accepted.append(server.accept())
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()


@pytest.fixture
def host_marker(tmp_path_factory):
    """A path on the host that a sandboxed program must not be able to create."""
    name = f"flywheel-pwned-{uuid.uuid4().hex}"
    paths = [Path("/tmp") / name, Path(__file__).resolve().parent / name, Path("/root") / name]
    yield name, paths
    for path in paths:
        assert not path.exists(), f"sandbox wrote {path} on the host"


# ---------------------------------------------------------------- plain behaviour

def test_program_sees_an_empty_work_dir_scrubbed_env_and_no_capabilities():
    secret = f"s3cret-{uuid.uuid4().hex}"
    os.environ["FLYWHEEL_TEST_SECRET"] = secret
    try:
        result = run_checked(
            "import os, sys\n"
            "print(os.getcwd(), os.listdir('.'), sorted(os.environ), os.getpid(), os.getuid())\n"
            "print(sys.path)\n"
            "print(open('/proc/self/status').read() if os.path.exists('/proc/self/status') else 'no-proc')\n")
    finally:
        del os.environ["FLYWHEEL_TEST_SECRET"]
    first, path_line, proc = result.stdout.split("\n", 2)
    assert first == "/tmp [] ['HOME', 'LANG', 'PATH', 'PWD'] 1 65534"
    assert "site-packages" not in path_line and "/work" not in path_line
    assert proc.strip() == "no-proc"
    assert secret not in result.stdout


def test_missing_bubblewrap_refuses_and_says_how_to_fix():
    with pytest.raises(SandboxUnavailable, match=r"apt-get install -y bubblewrap.*isolation='none'"):
        run_python("print(1)", config=SandboxConfig(bwrap_path="/nonexistent/bwrap"))


def test_isolation_none_runs_only_when_asked_and_says_so(caplog):
    sandbox._warned_unisolated = False
    result = run_python("print(6 * 7)", config=SandboxConfig(isolation="none"))
    assert result.stdout == "42\n" and "isolation='none'" in result.detail
    assert "SANDBOX DISABLED" in caplog.text


@pytest.mark.parametrize("field, value, hint", [
    ("timeout_s", 0, "timeout_s must be > 0"), ("max_pids", 0, "positive integer"),
    ("memory_mb", 16, "use >= 64"), ("isolation", "docker", "'bwrap' or 'none'"),
    ("python_path", "python3", "must be absolute"),
])
def test_config_validation_says_how_to_fix(field, value, hint):
    with pytest.raises(ValueError, match=hint):
        SandboxConfig(**{field: value})


# ---------------------------------------------------------------- attacks

def test_network_egress_is_blocked():
    result = run_checked(
        "import socket\n"
        "for host, port in [('1.1.1.1', 80), ('8.8.8.8', 53)]:\n"
        "    try:\n"
        "        socket.create_connection((host, port), timeout=1); print('CONNECTED')\n"
        "    except OSError as e:\n"
        "        print('blocked', e.errno)\n"
        "try:\n"
        "    socket.getaddrinfo('pypi.org', 443); print('RESOLVED')\n"
        "except OSError:\n"
        "    print('no dns')\n")
    assert result.status == "ok" and "CONNECTED" not in result.stdout and "RESOLVED" not in result.stdout
    assert result.stdout.count("blocked") == 2


def test_loopback_cannot_reach_a_host_listener(listener):
    port, accepted = listener
    result = run_checked(
        "import socket\n"
        f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1); print('CONNECTED')\n"
        "except OSError as e:\n    print('refused', e.errno)\n")
    time.sleep(0.3)  # give the listener a chance to record a connection, if one came
    assert result.stdout.startswith("refused") and accepted == []
    # The listener is real: the same connect from the host does get through.
    socket.create_connection(("127.0.0.1", port), timeout=1).close()
    time.sleep(0.3)
    assert len(accepted) == 1


def test_fork_bomb_as_root_is_capped_by_the_pids_cgroup_and_killed_at_timeout():
    result = run_checked(
        "import os\n"
        "while True:\n"
        "    try:\n        os.fork()\n"
        "    except OSError:\n        pass\n", SandboxConfig(timeout_s=2.0, cpu_s=10, max_pids=32))
    assert result.status == "timeout" and result.exit_code is None
    events = [p for p in Path("/sys/fs/cgroup/pids").glob(f"flywheel-{os.getpid()}/w*/pids.events")]
    if events:  # cgroup v1 here: forks were refused at the limit
        assert sum(int(p.read_text().split()[1]) for p in events) > 0


def test_thread_bomb_stops_at_the_pids_limit():
    result = run_checked(
        "import threading, time\n"
        "n = 0\n"
        "try:\n"
        "    while True:\n"
        "        threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); n += 1\n"
        "except RuntimeError:\n"
        "    print('stopped at', n, flush=True)\n"
        "import os; os._exit(0)\n",
        # A large address space, so that the pids limit, not RLIMIT_AS (each thread's
        # stack and malloc arena reserve address space), is what stops the bomb.
        SandboxConfig(timeout_s=5.0, max_pids=20, memory_mb=8192))
    assert result.status == "ok", result
    # 20 tasks = the program's main thread + 19 threads: the limit is exactly max_pids.
    assert result.stdout == "stopped at 19\n"


def test_memory_bomb_hits_the_address_space_limit():
    result = run_checked("x = bytearray(3 * 1024 ** 3)", SandboxConfig(timeout_s=5.0, memory_mb=256))
    assert (result.status, result.exit_code) == ("ok", 1) and "MemoryError" in result.stderr
    grow = run_checked("chunks = []\nwhile True:\n    chunks.append(b'x' * 10 ** 7)",
                       SandboxConfig(timeout_s=5.0, memory_mb=256))
    assert grow.exit_code == 1 and "MemoryError" in grow.stderr


def test_memory_bomb_across_processes_is_bounded_by_the_memory_cgroup():
    # `make` runs the suite as root on a machine with cgroup v1 memory: the pool made one
    assert list(Path("/sys/fs/cgroup/memory").glob(f"**/flywheel-{os.getpid()}")), "no memory cgroup"
    # Each child stays under RLIMIT_AS; together they are 8 x 200 MB against a cgroup of
    # memory_mb + work dirs + overhead = 512 MB, so the kernel's OOM killer steps in.
    result = run_checked(
        "import os\n"
        "pids = []\n"
        "for i in range(8):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        block = bytearray(b'x') * (200 << 20)\n"
        "        os._exit(0)\n"
        "    pids.append(pid)\n"
        "print([os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids])\n",
        SandboxConfig(timeout_s=20.0, memory_mb=256, max_pids=16))
    statuses = eval(result.stdout)
    assert result.status == "ok" and -9 in statuses, result


def test_cpu_spin_is_a_timeout_not_a_wrong_answer():
    wall = run_checked("while True:\n    pass", SandboxConfig(timeout_s=1.0, cpu_s=10))
    assert (wall.status, wall.exit_code) == ("timeout", None) and "wall-clock" in wall.detail
    # A generous wall clock: on a busy shared machine one CPU second can take several.
    cpu = run_checked("while True:\n    pass", SandboxConfig(timeout_s=20.0, cpu_s=1))
    assert cpu.status == "timeout" and "CPU time limit" in cpu.detail


def test_sleep_is_killed_at_the_wall_clock_timeout():
    result = run_checked("import time\nprint('start', flush=True)\ntime.sleep(600)",
                         SandboxConfig(timeout_s=1.0), within_s=3.0)
    assert result.status == "timeout" and result.stdout == "start\n"


def test_setsid_orphan_holding_stdout_does_not_hang_the_harness():
    result = run_checked(
        "import os, subprocess, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    time.sleep(600)\n"
        "subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
        "print('parent done')\n", SandboxConfig(timeout_s=5.0), within_s=2.5)
    assert (result.status, result.exit_code, result.stdout) == ("ok", 0, "parent done\n")


def test_100_mb_of_output_is_capped_and_the_flooder_killed():
    result = run_checked("import sys\nsys.stdout.write('x' * 100_000_000)\nprint('END')",
                         SandboxConfig(timeout_s=10.0, max_output_bytes=100_000), within_s=5.0)
    assert result.status == "ok" and result.output_truncated and result.exit_code == -9
    assert len(result.stdout) == 100_000 and "END" not in result.stdout
    assert "output exceeded" in result.detail
    endless = run_checked("while True:\n    print('y' * 1000)",
                          SandboxConfig(timeout_s=10.0, max_output_bytes=50_000), within_s=5.0)
    assert endless.output_truncated and len(endless.stdout) == 50_000


def test_disk_fill_stops_at_the_file_and_work_dir_limits():
    tag = f"fill-{uuid.uuid4().hex}"
    result = run_checked(
        "import errno\n"
        "chunk = b'x' * (1 << 20)\n"
        "try:\n"
        f"    with open('{tag}-big', 'wb') as f:\n"
        "        while True: f.write(chunk); f.flush()\n"
        "except OSError as e:\n"
        "    print('big', errno.errorcode[e.errno])\n"
        "written = 0\n"
        "try:\n"
        "    for i in range(10 ** 6):\n"
        f"        with open(f'{tag}-{{i}}', 'wb') as f: f.write(chunk[: 1 << 19]); f.flush()\n"
        "        written += 1\n"
        "except OSError as e:\n"
        "    print('many', errno.errorcode[e.errno], written)\n",
        SandboxConfig(timeout_s=10.0, max_file_mb=4, work_dir_mb=16), within_s=8.0)
    lines = result.stdout.split()
    # One file stops at RLIMIT_FSIZE; many files stop when the 16 MB tmpfs is full.
    assert lines[:2] == ["big", "EFBIG"] and lines[2:4] == ["many", "ENOSPC"] and int(lines[4]) < 32
    for place in (Path("/tmp"), Path.cwd(), Path.home()):
        assert not list(place.glob(f"{tag}*")), f"the disk fill reached {place} on the host"


def test_writes_outside_the_work_dir_fail_and_reach_nothing_on_the_host(host_marker):
    name, host_paths = host_marker
    targets = [f"/{name}", f"/usr/{name}", f"/etc/{name}", f"/dev/{name}", f"/proc/{name}",
               f"/root/.pyenv/{name}", str(Path(__file__).resolve().parent / name), f"/work/{name}"]
    result = run_checked(
        "ok = []\n"
        f"for path in {targets!r} + ['/tmp/x', '/dev/shm/x']:\n"
        "    try:\n"
        "        open(path, 'w').write('pwned'); ok.append(path)\n"
        "    except OSError:\n"
        "        pass\n"
        "print(ok)\n")
    assert result.stdout == "['/tmp/x', '/dev/shm/x']\n"


def test_secrets_and_project_files_are_not_readable():
    result = run_checked(
        "import os\n"
        "for path in ['/etc/shadow', '/etc/passwd', '/proc/1/environ', '/proc/self/environ',\n"
        f"             {str(Path(__file__).resolve())!r}, '/work/main/pyproject.toml', '/root/.ssh']:\n"
        "    try:\n"
        "        print(path, 'READ', len(open(path, 'rb').read()))\n"
        "    except OSError as e:\n"
        "        print(path, 'denied', type(e).__name__)\n"
        "print(os.listdir('/'))\n")
    assert "READ" not in result.stdout, result.stdout
    top = eval(result.stdout.splitlines()[-1])
    assert "etc" not in top and "work" not in top and "home" not in top


@pytest.mark.parametrize("launcher", [
    "import posix\nposix.system(CMD)",
    "import ctypes\nctypes.CDLL(None).system(CMD.encode())",
    "import _posixsubprocess, os\n"
    "pid = _posixsubprocess.fork_exec([b'/bin/sh', b'-c', CMD.encode()], [b'/bin/sh'], True, (), None, None,\n"
    "    -1, -1, -1, -1, -1, -1, *os.pipe(), False, False, -1, None, None, None, -1, None, False)\n"
    "os.waitpid(pid, 0)",
], ids=["posix.system", "ctypes", "_posixsubprocess"])
def test_bypassing_python_level_guards_gains_nothing(launcher, host_marker, listener):
    name, _ = host_marker
    port, accepted = listener
    connect = f"import socket; socket.create_connection(('127.0.0.1', {port}), 1); print('CONNECTED')"
    cmd = (f"touch /tmp/../{name} /work/{name} /root/{name} 2>/dev/null; "
           f"{os.path.realpath(sys.executable)} -I -S -c \"{connect}\" 2>/dev/null; echo shell-ran")
    guarded = ("import os, builtins\n"
               "os.system = os.popen = os.fork = os.execv = None  # the kind of guard being bypassed\n"
               f"CMD = {cmd!r}\n" + launcher)
    result = run_checked(guarded)
    time.sleep(0.3)
    assert result.status == "ok" and "shell-ran" in result.stdout and "CONNECTED" not in result.stdout
    assert accepted == []


def test_no_capability_and_no_way_to_regain_one():
    result = run_checked(
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "caps = (ctypes.c_uint32 * 6)()\n"
        "libc.capget((ctypes.c_uint32 * 2)(0x20080522, 0), caps)\n"
        "print('caps', list(caps))\n"
        "print('userns', libc.unshare(0x10000000))\n"  # CLONE_NEWUSER: would grant caps again
        "print('mountns', libc.unshare(0x20000))\n"
        "print('umount-proc', libc.umount2(b'/proc', 2))\n"  # to reveal the zygote's /proc
        "print('mount', libc.mount(b'tmpfs', b'/usr', b'tmpfs', 0, None))\n"
        "print('chroot', libc.chroot(b'/tmp'))\n")
    assert result.stdout.splitlines() == ["caps [0, 0, 0, 0, 0, 0]", "userns -1", "mountns -1",
                                          "umount-proc -1", "mount -1", "chroot -1"]


def test_killing_the_parent_and_everyone_hurts_only_the_run():
    run_python("pass", config=FAST)
    host_pids = sorted(_descendants())  # bubblewrap and zygote processes, host pid numbers
    result = run_checked(
        "import os, signal, subprocess\n"
        "helper = subprocess.Popen(['sleep', '600'])\n"
        f"for pid in {host_pids!r} + [os.getppid()]:\n"
        "    try:\n        os.kill(pid, signal.SIGKILL); print('killed', pid)\n"
        "    except ProcessLookupError:\n        print('no', pid)\n"
        "os.kill(-1, signal.SIGKILL)  # kill -9 -1\n"
        "print('helper', helper.wait(), 'me', os.getpid())\n")
    # The host's pids do not exist in the run's pid namespace. getppid() is 0 there, so
    # "kill the parent" signals the run's own process group; the program is that
    # namespace's init, which the kernel shields from its own signals.
    assert result.status == "ok" and result.exit_code == 0, result
    assert result.stdout.splitlines() == [f"no {pid}" for pid in host_pids] + ["killed 0", "helper -9 me 1"]


def test_consecutive_runs_on_a_warm_worker_share_nothing():
    config = SandboxConfig(timeout_s=5.0, max_pids=16)
    first = run_checked(
        "import os, json, socket, subprocess, builtins, sys\n"
        "open('/tmp/left', 'w').write('a'); open('/dev/shm/left', 'w').write('a')\n"
        "os.environ['LEFT'] = '1'\n"
        "json.dumps = lambda *a, **k: 'tampered'\n"
        "builtins.len = lambda x: -1\n"
        "sys.modules['os'].getcwd = lambda: 'tampered'\n"
        "s = socket.socket(socket.AF_UNIX); s.bind('\\0flywheel-left'); s.listen()\n"
        "subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
        "if os.fork() == 0:\n    os.setsid(); import time; time.sleep(600)\n"
        "print(os.getpid(), 'planted')\n", config)
    assert first.stdout == "1 planted\n"
    second = run_checked(
        "import os, json, socket, builtins\n"
        "print(os.listdir('/tmp'), os.listdir('/dev/shm'), 'LEFT' in os.environ, json.dumps([1]),\n"
        "      len('ab'), os.getcwd(), os.getpid())\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n    s.connect('\\0flywheel-left'); print('LEAK')\nexcept OSError:\n    print('alone')\n"
        "import subprocess\nprint(subprocess.run(['ps', '-e'], capture_output=True).returncode)\n", config)
    lines = second.stdout.splitlines()
    assert lines[0] == "[] [] False [1] 2 /tmp 1" and lines[1] == "alone"
