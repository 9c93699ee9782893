"""The warm sandboxed worker ("zygote") and the framing it shares with the host.

The host imports this file for the framing and `collect_output`; inside bubblewrap it
runs as `python3 -I -S -c <its text>` (no project file is mounted there), so it uses the
standard library only.

Per job the zygote forks the program process as pid 1 of a fresh pid namespace. That
process enters fresh mount, ipc and uts namespaces, mounts an empty tmpfs on /tmp (the
work dir, also its cwd) and /dev/shm, hides /proc, sets rlimits, drops every capability
and runs the source with `exec` in a fresh `__main__`: no interpreter start-up per run,
which is what makes the sandbox faster than a bare `python3 -I -S` subprocess. The
zygote meanwhile collects its output and enforces the wall clock. When pid 1 exits or is
killed, the kernel kills everything left in its pid namespace, so nothing the program
started outlives the run, and its mount/ipc namespaces (files, shared memory,
semaphores) die with it. The program shares no memory with the zygote (fork is
copy-on-write), cannot see it (other pid namespace, no /proc), holds none of its file
descriptors and has no capability left, so it cannot tamper with later runs.

One deviation from `python3 -c`: as its namespace's init, the program ignores signals it
sends itself without a handler (os.kill(os.getpid(), SIGTERM) does nothing); the zygote's
SIGKILL on timeout does reach it. Not done here: the pids and memory cgroups, which the
host sets on the whole worker (sandbox_cgroup.py).
"""

import gc
import json
import os
import select
import selectors
import signal
import struct
import sys
import time

_HEADER = struct.Struct("!III")  # lengths of: json header, stdout bytes, stderr bytes
_READ_CHUNK = 1 << 16
# After the program exits, wait this long for its pipes to close. Inside the sandbox they
# close at once (its pid namespace is gone); with isolation="none" a daemonised
# grandchild may hold them open forever, so we stop waiting.
_DRAIN_AFTER_EXIT_S = 0.5
_DRAIN_AFTER_KILL_S = 2.0

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWPID = 0x20000, 0x4000000, 0x8000000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 0x4000, 1 << 18


def send_frame(fd: int, header: dict, out: bytes = b"", err: bytes = b"",
               deadline: float | None = None) -> None:
    """Write one frame: fixed-size lengths, a JSON header, then two raw byte blobs.

    With a `deadline` (time.monotonic()), `fd` must be non-blocking; TimeoutError past it.
    """
    head = json.dumps(header).encode()
    data = memoryview(_HEADER.pack(len(head), len(out), len(err)) + head + out + err)
    while data:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([], [fd], [], remaining)[1]:
                raise TimeoutError(f"frame not taken within the deadline ({len(data)} bytes left)")
        try:
            data = data[os.write(fd, data):]
        except BlockingIOError:
            continue


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError(f"no complete frame within the deadline ({got}/{n} bytes)")
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, deadline: float | None = None,
               max_bytes: int = 1 << 30) -> tuple[dict, bytes, bytes] | None:
    """Read one frame; None on a clean end of stream.

    Raises TimeoutError past `deadline` (a time.monotonic() value) and ValueError on a
    malformed or oversized frame.
    """
    raw = _read_exact(fd, _HEADER.size, deadline)
    if raw is None:
        return None
    hlen, olen, elen = _HEADER.unpack(raw)
    if hlen + olen + elen > max_bytes:
        raise ValueError(f"frame of {hlen + olen + elen} bytes exceeds {max_bytes}")
    body = _read_exact(fd, hlen + olen + elen, deadline)
    if body is None:
        raise ValueError("stream ended inside a frame")
    return json.loads(body[:hlen]), body[hlen:hlen + olen], body[hlen + olen:]


def collect_output(pid: int, fds: list[int], deadline: float, cap: int) -> dict:
    """Read the program's pipes until they close, it times out or it floods them.

    Each stream keeps at most `cap` bytes; past that the program is killed, since
    draining 100 MB only to throw it away costs more than the verdict is worth.
    Returns the captured bytes per fd and what stopped the run; the caller reaps `pid`.
    """
    pidfd = os.pidfd_open(pid)
    sel = selectors.DefaultSelector()
    sel.register(pidfd, selectors.EVENT_READ)
    for fd in fds:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    bufs = {fd: bytearray() for fd in fds}
    state = {"timed_out": False, "truncated": False, "exited": False}
    open_fds, stop_at = set(fds), deadline
    while open_fds or not state["exited"]:
        remaining = stop_at - time.monotonic()
        if remaining <= 0:
            if state["exited"] or state["timed_out"] or state["truncated"]:
                break  # pipes held open past the grace period: stop waiting for them
            state["timed_out"] = True
            _kill(pid)
            stop_at = time.monotonic() + _DRAIN_AFTER_KILL_S
            continue
        for key, _ in sel.select(remaining):
            if key.fd == pidfd:
                sel.unregister(pidfd)
                state["exited"] = True
                stop_at = min(stop_at, time.monotonic() + _DRAIN_AFTER_EXIT_S)
                continue
            chunk = os.read(key.fd, _READ_CHUNK)
            if not chunk:
                sel.unregister(key.fd)
                open_fds.discard(key.fd)
                continue
            buf = bufs[key.fd]
            if len(buf) + len(chunk) > cap and not state["truncated"]:
                state["truncated"] = True
                _kill(pid)
                stop_at = min(stop_at, time.monotonic() + _DRAIN_AFTER_KILL_S)
            buf += chunk[:max(0, cap - len(buf))]
    sel.close()
    os.close(pidfd)
    state["output"] = [bytes(bufs[fd]) for fd in fds]
    return state


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# ---------------------------------------------------------------- inside the sandbox only

_LIBC = None  # ctypes handle, loaded once by the zygote and inherited by every fork
_OWN_PID_NS = -1  # fd of the zygote's pid namespace, to reset pid_ns_for_children per run


def _libc_call(name: str, *args) -> None:
    import ctypes
    if getattr(_LIBC, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}{args[:3]}: {os.strerror(err)}")


def _mount(source: bytes | None, target: bytes, fstype: bytes | None, flags: int,
           data: bytes | None = None) -> None:
    _libc_call("mount", source, target, fstype, flags, data)


def _fork_in_new_pid_namespace() -> int:
    """fork(), the child being pid 1 of a fresh pid namespace; the zygote's own stays."""
    # unshare(CLONE_NEWPID) only redirects our future children, and only once; joining
    # our own namespace again re-arms it.
    _libc_call("setns", _OWN_PID_NS, CLONE_NEWPID)
    _libc_call("unshare", CLONE_NEWPID)
    return os.fork()


def _enter_run_namespaces(work_dir_mb: int) -> None:
    """In the run's pid 1: private mount/ipc/uts namespaces and an empty work dir."""
    _libc_call("unshare", CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS)
    # Private first, so the per-run mounts below never propagate back to the zygote.
    _mount(None, b"/", None, MS_REC | MS_PRIVATE)
    opts = f"size={work_dir_mb}m,nr_inodes=16384,mode=0777".encode()
    _mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, opts)
    _mount(b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts)
    _libc_call("sethostname", b"sandbox", 7)
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")  # under memory pressure the program dies, not the zygote
    # /proc still shows the zygote's pid namespace: cover it. (A fresh proc mount is
    # refused in a user namespace whose proc has locked sub-mounts, as bubblewrap's has.)
    _mount(b"tmpfs", b"/proc", b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, b"size=4k")


def _drop_capabilities() -> None:
    """Leave the program no capability in any set, and prove it with capget."""
    import ctypes
    pr_capbset_drop, pr_cap_ambient, pr_cap_ambient_clear_all = 24, 47, 4
    for cap in range(64):  # bounding set first: dropping it needs CAP_SETPCAP
        _LIBC.prctl(pr_capbset_drop, cap, 0, 0, 0)
    _libc_call("prctl", pr_cap_ambient, pr_cap_ambient_clear_all, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    _libc_call("capset", header, (ctypes.c_uint32 * 6)())
    left = (ctypes.c_uint32 * 6)()
    _libc_call("capget", header, left)
    if any(left):
        raise OSError(f"capabilities still held after capset: {list(left)}")


def _set_rlimits(job: dict) -> None:
    import resource
    mb = 1 << 20
    limits = {
        resource.RLIMIT_AS: job["memory_mb"] * mb,
        resource.RLIMIT_CPU: job["cpu_s"],
        resource.RLIMIT_FSIZE: job["max_file_mb"] * mb,
        resource.RLIMIT_NOFILE: job["max_open_files"],
        resource.RLIMIT_CORE: 0,
    }
    for which, value in limits.items():
        # Hard CPU limit one second above the soft one: SIGXCPU first, SIGKILL if ignored.
        hard = value + 1 if which == resource.RLIMIT_CPU else value
        resource.setrlimit(which, (value, hard))


def _run_program(job: dict, source: str, fds: dict) -> None:
    """Pid 1 of the run's namespaces: lock down, then run the source. Never returns."""
    setup_w = fds["setup_w"]
    try:
        os.setsid()
        _enter_run_namespaces(job["work_dir_mb"])
        for target, fd in ((0, fds["stdin"]), (1, fds["out_w"]), (2, fds["err_w"])):
            os.dup2(fd, target)
        os.chdir("/tmp")
        _set_rlimits(job)
        import resource
        # Counted per user namespace, so only this run's tasks count. Ignored when the
        # sandbox uid maps to host root (our case); the pids cgroup is the real limit.
        resource.setrlimit(resource.RLIMIT_NPROC, (job["max_pids"], job["max_pids"]))
        _drop_capabilities()
        os.closerange(3, setup_w)
        os.closerange(setup_w + 1, 1 << 16)
    except BaseException as exc:  # any set-up failure is the sandbox's, never the program's
        os.write(setup_w, f"program set-up failed: {exc!r}".encode()[:4000])
        os._exit(125)
    os.close(setup_w)  # EOF tells the zygote the lock-down is complete
    os._exit(_exec_main(source))


def _exec_main(source: str) -> int:
    """Run `source` like `python3 -I -S -c source` would, and return its exit status."""
    import builtins
    import types
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    sys.argv = ["-c"]
    code = 0
    try:
        exec(compile(source, "<string>", "exec"), main.__dict__)
    except SystemExit as exc:
        code = _system_exit_code(exc)
    except BaseException as exc:
        # Drop our own frame so the traceback reads as the program's alone.
        exc = exc.with_traceback(exc.__traceback__.tb_next)
        sys.excepthook(type(exc), exc, exc.__traceback__)
        code = 1
    return _finalize(code)


def _system_exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _finalize(code: int) -> int:
    """What interpreter shutdown would do: join threads, run atexit, flush stdio."""
    try:
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()
        import atexit
        atexit._run_exitfuncs()
    except SystemExit as exc:
        code = _system_exit_code(exc)
    except BaseException:
        sys.excepthook(*sys.exc_info())
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            code = code or 120  # CPython's status when flushing stdout fails at exit
    return code


def _run_job(job: dict, source: str, stdin: bytes) -> tuple[dict, bytes, bytes]:
    """One run, supervised by the zygote: fork pid 1 of the run, collect, classify."""
    fds = {"stdin": os.memfd_create("stdin")}
    os.write(fds["stdin"], stdin)
    os.lseek(fds["stdin"], 0, os.SEEK_SET)
    (out_r, fds["out_w"]), (err_r, fds["err_w"]) = os.pipe(), os.pipe()
    setup_r, fds["setup_w"] = os.pipe()
    started = time.monotonic()
    pid = _fork_in_new_pid_namespace()
    if pid == 0:
        _run_program(job, source, fds)
    for fd in fds.values():
        os.close(fd)
    try:
        # Blocks until the program's set-up ends: EOF on success, else one message of
        # < PIPE_BUF bytes, which a single read gets whole.
        setup_error = os.read(setup_r, 8192)
        os.close(setup_r)
        if setup_error:
            _kill(pid)
            os.waitpid(pid, 0)
            return {"status": "sandbox_error", "detail": setup_error.decode(errors="replace")}, b"", b""
        state = collect_output(pid, [out_r, err_r], started + job["timeout_s"], job["max_output_bytes"])
        # Pid 1 gone means its namespace is empty: the kernel killed and reaped the rest.
        _, status, usage = os.wait4(pid, 0)
    finally:
        os.close(out_r)
        os.close(err_r)
    header = classify(job, state, status, usage.ru_utime + usage.ru_stime)
    header["duration_ms"] = (time.monotonic() - started) * 1000
    return (header, *state["output"])


def classify(job: dict, state: dict, status: int, cpu_s: float) -> dict:
    """Turn how the program ended into the header of a result frame."""
    exit_code = os.waitstatus_to_exitcode(status)
    header = {"status": "ok", "exit_code": exit_code, "truncated": state["truncated"], "detail": ""}
    if state["timed_out"]:
        header.update(status="timeout", exit_code=None,
                      detail=f"wall-clock timeout after {job['timeout_s']} s; the run's processes were killed")
    elif exit_code == -signal.SIGXCPU or (exit_code == -signal.SIGKILL and cpu_s >= job["cpu_s"]):
        header.update(status="timeout", exit_code=None, detail=f"CPU time limit of {job['cpu_s']} s exceeded")
    elif state["truncated"]:
        header["detail"] = f"output exceeded {job['max_output_bytes']} bytes per stream; program killed"
    return header


def main() -> None:
    """Zygote loop: one job frame in, one result frame out, until the host hangs up."""
    global _LIBC, _OWN_PID_NS
    import atexit, builtins, ctypes, resource, types  # noqa: F401,E401  once here, not per run
    _LIBC = ctypes.CDLL(None, use_errno=True)
    # bubblewrap's pid namespace belongs to the host's user namespace, so we could not
    # join it again (see _fork_in_new_pid_namespace). The zygote proper is therefore
    # pid 1 of a namespace of our own; this first process only waits for it.
    _libc_call("unshare", CLONE_NEWPID)
    if (pid := os.fork()) != 0:
        os._exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) & 0xFF)
    _OWN_PID_NS = os.open("/proc/self/ns/pid", os.O_RDONLY)
    chan_in, chan_out = os.dup(0), os.dup(1)
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):  # the program gets its own stdio; ours must not leak into it
        os.dup2(null, fd)
    # Every object the zygote owns moves to the permanent generation, so a collection in
    # a run does not write to (and copy-on-write fault in) the whole inherited heap.
    gc.collect()
    gc.freeze()
    try:  # a self-test run, so a machine that cannot build the namespaces fails loudly now
        probe = _run_job({"timeout_s": 10, "cpu_s": 10, "memory_mb": 256, "max_file_mb": 1, "max_open_files": 16,
                          "max_pids": 4, "max_output_bytes": 100, "work_dir_mb": 1}, "print('ready')", b"")
    except OSError as exc:
        probe = (repr(exc),)
    ready = probe[0]["status"] == "ok" and probe[1] == b"ready\n" if len(probe) == 3 else False
    send_frame(chan_out, {"ready": ready, "detail": "" if ready else f"self-test run failed: {probe}"})
    while (frame := read_frame(chan_in)) is not None:
        job, source, stdin = frame
        try:
            send_frame(chan_out, *_run_job(job, source.decode("utf-8", "surrogatepass"), stdin))
        except BaseException as exc:  # our own failure: report it, then let the host replace us
            send_frame(chan_out, {"status": "sandbox_error", "fatal": True, "detail": f"zygote failed: {exc!r}"})
            os._exit(1)


def run_once(source_fd: int, job: dict) -> None:
    """isolation='none': this fresh interpreter runs the program itself, rlimits only."""
    with os.fdopen(source_fd, "rb") as f:
        source = f.read().decode("utf-8", "surrogatepass")
    _set_rlimits(job)
    os._exit(_exec_main(source))


if __name__ == "__main__":
    if len(sys.argv) == 3:  # -c <source> <fd> <job>: the unisolated mode
        run_once(int(sys.argv[1]), json.loads(sys.argv[2]))
    else:
        main()
