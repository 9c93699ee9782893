"""The program that runs inside the sandbox for one code verification.

This file's text is the sandbox's source (`verifiers/code.py` sends it); it must use the
standard library only and import nothing of ours. The task arrives on stdin as JSON
{"nonce", "program", "tests", "entry_point"}; stdin is read to the end and closed before
any model code runs, so the tests and the nonce are never on disk nor readable later.

Why a nonce: exit status alone proves nothing (`os._exit(0)` in the program "passes"
every test). The harness reports with one line `@@flywheel-result <nonce> <outcome>
<detail>`, written by the audit hook after `check` returned, and the host believes no
other line. The nonce lives only in the hook's closure. The hook (`sys.addaudithook`,
which cannot be removed) is what keeps model code from reaching it:
  * it refuses frame introspection (sys._getframe except from a few stdlib callers that
    only read the caller's module name, tb_frame, gi_frame/cr_frame/ag_frame, f_code,
    sys._current_frames, settrace/setprofile), gc.get_objects/get_referrers/get_referents,
    new audit hooks, ctypes, code-object surgery (code.__new__, setting __code__,
    compile() with a real file name, marshal), processes and signals (os.system, exec,
    spawn, fork, kill, subprocess, _posixsubprocess), sockets, links, and open() outside
    the work dir (reads of the interpreter's stdlib are allowed, for imports);
  * every refusal is also recorded; a run with any record never reports "pass";
  * harness events ("flywheel.*") are believed only from the harness's own main frame,
    so model code cannot announce a result; after the one result line the nonce is
    forgotten.
The hook never calls anything model code could have replaced (it captured the C
functions it needs and compares only by identity), so no model code ever runs while a
hook frame, with the nonce in its closure, is on the stack.

Known limit: this is defence in depth inside one interpreter, not a proof. A Python
signal handler installed by the model can run between two bytecodes of the hook and
receive its frame; the result is then forged. Closing that needs the check to run in a
different process from the candidate, which would change what tests may pass to it.
"""
import os
import sys

RESULT_MARK = "@@flywheel-result"
_DENIED_EVENTS = frozenset({
    "sys._current_frames", "sys.settrace", "sys.setprofile", "sys.addaudithook",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "code.__new__",
    "function.__new__", "os.system", "os.exec",
    "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.kill", "os.killpg",
    "subprocess.Popen", "pty.spawn", "signal.pthread_kill", "os.symlink", "os.link",
    "os.chroot",
})
_DENIED_PREFIXES = ("ctypes.", "socket.", "_winapi.", "winreg.")
_DENIED_IMPORTS = frozenset({"_posixsubprocess", "ctypes", "_ctypes"})
_FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_code",
                          "gi_code", "cr_code", "ag_code"})
# (function name) of stdlib code allowed to call sys._getframe: each only reads its
# caller's module name and lets no frame escape.
_GETFRAME_CALLERS = frozenset({"namedtuple", "_caller", "_create_"})
_SAFE_DEVICES = frozenset({"/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"})


class Refused(RuntimeError):
    """Raised by the hook to refuse an operation (RuntimeError: addaudithook swallows it)."""


def read_payload() -> dict:
    import json
    chunks = []
    while True:
        chunk = os.read(0, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(0)
    return json.loads(b"".join(chunks))


def make_hook(nonce: str, workdir: str, stdlib_dir: str, builtins_dict: dict):
    """The audit hook holding the nonce. Everything it calls is captured here, now."""
    state = {"phase": "setup", "main": None, "check": None, "check_code": None}
    flags: list = []
    _type, _startswith, _append, _refused = type, str.startswith, list.append, Refused
    read_caller, read_code, is_busy = _self_reads()
    user_event_reason = _user_event_checker(state, workdir, stdlib_dir, read_caller)
    report = _reporter(nonce, flags, state, builtins_dict, read_code)

    def flag(reason: str) -> None:
        if reason not in flags:
            _append(flags, reason)

    def refuse(reason: str) -> None:
        flag(reason)
        raise _refused("flywheel sandbox: " + reason)

    def harness_event(event: str, args) -> None:
        caller = read_caller(3)  # 0: read_caller, 1: here, 2: hook, 3: whoever called sys.audit
        if event == "flywheel.flag":
            flag(args[0] if _type(args[0]) is str else "flag")
        elif event == "flywheel.begin" and state["phase"] == "setup":
            state["main"], state["phase"] = caller, "user"
        elif event == "flywheel.tests" and state["check"] is None and state["phase"] == "user" \
                and caller.f_back is state["main"]:  # from run_user_code, called by main
            state["check"], state["check_code"] = args[0], read_code(args[0])
        elif caller is not state["main"] or state["phase"] != "user":
            refuse("forged harness event " + event)
        elif event == "flywheel.result":
            state["phase"] = "done"
            report(args[0], args[1])
        else:
            refuse("unexpected harness event " + event)

    def hook(event: str, args) -> None:
        if is_busy():
            return  # events caused by the hook's own frame / __code__ reads
        if _startswith(event, "flywheel."):
            harness_event(event, args)
            return
        if state["phase"] == "setup":
            return
        reason = user_event_reason(event, args)
        if reason is not None:
            refuse(reason)

    return hook


def _self_reads():
    """The hook's own frame and __code__ reads, which raise audit events of their own.

    While one runs, the hook lets its nested events through, in that thread only
    (another thread must not slip through meanwhile).
    """
    import _thread
    busy: set = set()
    _getframe, _ident, _add, _discard = sys._getframe, _thread.get_ident, set.add, set.discard

    def read_caller(depth: int, code_only: bool = False):
        _add(busy, _ident())
        frame = _getframe(depth)
        found = frame.f_code if code_only else frame
        _discard(busy, _ident())
        return found

    def read_code(function):
        _add(busy, _ident())
        code = function.__code__ if function is not None else None
        _discard(busy, _ident())
        return code

    def is_busy() -> bool:
        return _ident() in busy

    return read_caller, read_code, is_busy


def _open_checker(workdir: str, stdlib_dir: str):
    _type, _len, _startswith, _decode = type, len, str.startswith, bytes.decode
    work_prefix, lib_prefix = workdir + "/", stdlib_dir + "/"

    def open_reason(args) -> str | None:
        if _len(args) < 3:
            return "malformed open event"
        path, flags_arg = args[0], args[2]
        if _type(path) is int:
            return None
        if _type(path) is bytes:
            path = _decode(path, "utf-8", "replace")
        if _type(path) is not str:
            return "open() with an unusual path object"
        writing = _type(flags_arg) is int and flags_arg & 3 != 0
        if "/../" in "/" + path + "/":
            return "open() of a path with '..': " + path[:80]
        if not _startswith(path, "/") or _startswith(path, work_prefix) or path in _SAFE_DEVICES:
            return None
        if not writing and _startswith(path, lib_prefix):
            return None
        return "open() outside the work dir: " + path[:80]

    return open_reason


def _user_event_checker(state: dict, workdir: str, stdlib_dir: str, read_caller):
    """Why an audit event raised by model code is refused, or None to allow it."""
    _type, _startswith, lib_prefix = type, str.startswith, stdlib_dir + "/"
    open_reason = _open_checker(workdir, stdlib_dir)

    def user_event_reason(event: str, args) -> str | None:
        if event == "open":
            return open_reason(args)
        if event == "sys._getframe" or event == "marshal.loads":
            code = read_caller(3, code_only=True)  # 0: read_caller, 1: here, 2: hook, 3: the caller
            if event == "marshal.loads":  # imports load .pyc files; crafted code objects no
                allowed = _startswith(code.co_filename, "<frozen importlib")
                return None if allowed else "marshal.loads of a code object"
            allowed = _startswith(code.co_filename, lib_prefix) and code.co_name in _GETFRAME_CALLERS
            return None if allowed else "frame introspection (sys._getframe)"
        if event == "object.__getattr__":
            name = args[1]
            if _type(name) is not str:
                return None  # only C code raises this event, always with a str name
            if name in _FRAME_ATTRS:
                return "frame introspection (." + name + ")"
            if name == "__code__" and args[0] is state["check"]:
                return "reading the tests (check.__code__)"
            return None
        if event == "object.__setattr__":
            return "replacing a code object" if _type(args[1]) is str and args[1] == "__code__" else None
        if event == "compile":
            filename = args[1]
            named = _type(filename) is str and not _startswith(filename, "<")
            return "compile() with a file name" if named else None
        if event == "import":
            name = args[0]
            return "import of " + name if _type(name) is str and name in _DENIED_IMPORTS else None
        if event in _DENIED_EVENTS or _startswith(event, _DENIED_PREFIXES):
            return "forbidden operation " + event
        return None

    return user_event_reason


def _reporter(nonce: str, flags: list, state: dict, builtins_dict: dict, read_code):
    """Writes the one result line; any recorded refusal turns the outcome into "hacking"."""
    secret = [nonce]
    keys0, values0 = tuple(builtins_dict), tuple(builtins_dict.values())
    _type, _len, _zip, _values, _write = type, len, zip, dict.values, os.write
    _replace, _join, _append = str.replace, str.join, list.append

    def intact() -> bool:
        """Builtins and check's code are the very objects they were before model code ran."""
        if _len(builtins_dict) != _len(keys0):
            return False
        for key, key0 in _zip(builtins_dict, keys0):
            if key is not key0:
                return False
        for value, value0 in _zip(_values(builtins_dict), values0):
            if value is not value0:
                return False
        return read_code(state["check"]) is state["check_code"]

    def report(outcome, detail) -> None:
        if _type(outcome) is not str or _type(detail) is not str:
            outcome, detail = "error", "harness passed a non-string result"
        if not intact():
            _append(flags, "builtins or the check function were modified")
        if flags:
            outcome, detail = "hacking", _join("; ", flags)
        line = "\n" + RESULT_MARK + " " + secret[0] + " " + outcome + " " + _replace(detail[:400], "\n", " ") + "\n"
        secret[0] = "-"  # one result per run: nothing left to steal afterwards
        _write(1, line.encode())

    return report


class _Probe:
    """Equal to nothing: a result that claims to equal it has a rigged __eq__."""

    def __eq__(self, other):
        return NotImplemented

    __hash__ = object.__hash__


def rigged_equality(value, probe=_Probe()) -> bool:
    items = [value]
    if type(value) in (list, tuple, set, frozenset):
        items += list(value)[:50]
    elif type(value) is dict:
        items += list(value.values())[:50]
    for item in items:
        try:
            if item == probe:
                return True
        except Exception:
            continue
    return False


def wrap_candidate(function, audit=sys.audit):
    def candidate(*args, **kwargs):
        result = function(*args, **kwargs)
        if rigged_equality(result):
            audit("flywheel.flag", "result claims to equal anything (rigged __eq__)")
        return result
    return candidate


def run_user_code(program_code, tests_code, entry_point: str, audit) -> tuple[str, str]:
    """Run program, tests, check(candidate); return (outcome, detail). Model code runs here."""
    import builtins
    program_ns = {"__name__": "candidate", "__builtins__": builtins}
    tests_ns = {"__name__": "tests", "__builtins__": builtins}
    stage = "program"
    try:
        exec(program_code, program_ns)
        function = program_ns.get(entry_point)
        if not callable(function):
            return "no_entry", f"the program defines no function {entry_point!r}"
        stage = "tests"
        exec(tests_code, tests_ns)
        check = tests_ns.get("check")
        if not callable(check):
            return "bad_tests", "the tests define no check(candidate)"
        audit("flywheel.tests", check)
        stage = "check"
        check(wrap_candidate(function))
    except SystemExit as exit_:
        return "hacking", f"SystemExit({exit_.code!r}) raised during the {stage}"
    except AssertionError as error:
        return "wrong", f"assertion failed in the {stage}: {str(error)[:200]}"
    except BaseException as error:  # noqa: BLE001 - any error of model code is a wrong answer
        return "wrong", f"{type(error).__name__} in the {stage}: {str(error)[:200]}"
    if tests_ns.get("check") is not check:
        return "hacking", "check was redefined while it ran"
    return "pass", ""


def main() -> None:
    import builtins
    payload = read_payload()
    sys.addaudithook(make_hook(payload.pop("nonce"), os.getcwd(), os.path.dirname(os.__file__),
                               builtins.__dict__))
    audit, entry_point = sys.audit, payload["entry_point"]
    try:
        program_code = compile(payload.pop("program"), "<candidate>", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as error:
        audit("flywheel.begin")
        audit("flywheel.result", "syntax", f"{type(error).__name__}: {error}")
        return
    tests_code = compile(payload.pop("tests"), "<tests>", "exec")
    del payload
    audit("flywheel.begin")
    outcome, detail = run_user_code(program_code, tests_code, entry_point, audit)
    audit("flywheel.result", outcome, detail)


if __name__ == "__main__":
    main()
