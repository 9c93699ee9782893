"""The program that runs inside the sandbox for one code verification.

This file's text is the sandbox's source (`verifiers/code.py` sends it); it must use the
standard library only and import nothing of ours. The task arrives on stdin as JSON
{"nonce", "program", "tests", "entry_point"}; stdin is read to the end and closed before
any model code runs, so the tests and the nonce are never on disk nor readable later.

Why a nonce: exit status alone proves nothing (`os._exit(0)` in the program "passes"
every test). The harness reports with one line `@@flywheel-result <nonce> <outcome>
<detail>`, written by the audit hook after `check` returned, and the host believes no
other line. The nonce lives only in the hook's closure, and model code runs in the same
interpreter, so everything rests on model code never reaching a frame or a closure of
the harness. The hook (`sys.addaudithook`, which cannot be removed) sees to that:
  * frames: sys._getframe, sys._current_frames, settrace/setprofile and the frame
    attributes (tb_frame, gi_frame, cr_frame, ag_frame, f_code) are refused, so no frame
    object ever reaches model code (f_back/f_locals need one to start from);
  * signal handlers, which are handed the frame they interrupt (measured: a 40 us timer
    caught the hook's frame in about half the runs), cannot be installed: `_signal.signal`
    is replaced and a fresh `_signal` can be neither imported nor built;
  * gc.get_objects/get_referrers/get_referents, new audit hooks, ctypes, code-object
    surgery (code.__new__, setting __code__, compile() with a real file name), processes
    and signals to them (os.system, exec, spawn, fork, kill, subprocess, _posixsubprocess),
    sockets, links, and open() outside the work dir (stdlib reads allowed, for imports)
    are refused; every refusal is recorded and a run with a record never reports "pass";
  * the hook never inspects frames itself and never calls anything model code could
    replace (it captured the C functions it needs and compares by identity): harness
    events prove their origin with a token object that only harness frames hold;
  * after the one result line, the nonce is forgotten.
The tests run in a namespace of their own, seeded with the program's names (HumanEval's
tests call the prompt's helpers) but never its dunders, a `check`, or a name that
shadows a builtin; the entry point there is the wrapped candidate (tests_namespace).

sys._getframe is refused without a record because namedtuple, typing and enum call it
for their caller's module name and fall back on the (ValueError) refusal; a refusal that
escapes model code is recorded. Builtins are compared by identity before reporting.

Known limits: this is defence in depth inside one interpreter, not a proof (a CPython
bug that hands out a frame without an audit event would reopen it); honest code that
uses inspect.currentframe, logging's caller lookup or signal handlers is scored
hacking_suspected. Running check in another process than the candidate would close the
class of attack, at the price of what tests may pass to the candidate.
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
_DENIED_IMPORTS = frozenset({"_posixsubprocess", "ctypes", "_ctypes", "_signal"})
_FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_code",
                          "gi_code", "cr_code", "ag_code"})
_SAFE_DEVICES = frozenset({"/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"})


class Refused(RuntimeError):
    """Raised by the hook to refuse an operation (RuntimeError: addaudithook swallows it)."""


class FrameRefused(Refused, ValueError):
    """A refused sys._getframe; a ValueError too, which is what stdlib callers catch."""


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


def make_hook(nonce: str, token: object, workdir: str, stdlib_dir: str, builtins_dict: dict):
    """The audit hook holding the nonce. Everything it calls is captured here, now.

    The hook never inspects frames itself (that would raise audit events of its own and
    open a window in which other code's events pass): harness events prove they come
    from the harness by carrying `token`, an object only the harness's frames hold.
    """
    state = {"phase": "setup", "check": None, "guard": None}
    flags: list = []
    _type, _startswith, _append, _refused, _frame_refused = type, str.startswith, list.append, Refused, FrameRefused
    user_event_reason = _user_event_checker(state, workdir, stdlib_dir)
    report = _reporter(nonce, flags, builtins_dict)

    def flag(reason: str) -> None:
        if reason not in flags:
            _append(flags, reason)

    def refuse(reason: str) -> None:
        flag(reason)
        raise _refused("flywheel sandbox: " + reason)

    def harness_event(event: str, args) -> None:
        if event == "flywheel.flag":
            flag(args[0] if args and _type(args[0]) is str else "flag")
        elif not args or args[0] is not token:
            refuse("forged harness event " + event)
        elif event == "flywheel.begin" and state["phase"] == "setup":
            state["phase"], state["guard"] = "user", args[1]
        elif event == "flywheel.tests" and state["phase"] == "user" and state["check"] is None:
            state["check"] = args[1]
        elif event == "flywheel.result" and state["phase"] == "user":
            state["phase"] = "done"
            report(args[1], args[2])
        else:
            refuse("unexpected harness event " + event)

    def hook(event: str, args) -> None:
        if _startswith(event, "flywheel."):
            harness_event(event, args)
            return
        if state["phase"] == "setup":
            return
        if event == "sys._getframe":
            # Refused without a record: namedtuple, typing and enum ask for their
            # caller's module name and fall back on ValueError. Model code that lets
            # the refusal escape is recorded by run_user_code.
            raise _frame_refused("flywheel sandbox: frame introspection (sys._getframe)")
        reason = user_event_reason(event, args)
        if reason is not None:
            refuse(reason)

    return hook


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


def _user_event_checker(state: dict, workdir: str, stdlib_dir: str):
    """Why an audit event raised while model code runs is refused, or None to allow it."""
    _type, _len, _startswith = type, len, str.startswith
    open_reason = _open_checker(workdir, stdlib_dir)

    def user_event_reason(event: str, args) -> str | None:
        if event == "open":
            return open_reason(args)
        if event in _DENIED_EVENTS or _startswith(event, _DENIED_PREFIXES):
            return "forbidden operation " + event
        if _len(args) < 2:
            return None  # the events below all carry two or more arguments
        if event == "object.__getattr__":
            name = args[1]
            if _type(name) is not str:
                return None  # only C code raises this event, always with a str name
            if name in _FRAME_ATTRS:
                return "frame introspection (." + name + ")"
            if name == "__code__" and args[0] is state["check"]:
                return "reading the tests (check.__code__)"
            if (name == "__defaults__" or name == "__kwdefaults__") and args[0] is state["guard"]:
                return "reading the signal guard's defaults"
            return None
        if event == "object.__setattr__":
            return "replacing a code object" if _type(args[1]) is str and args[1] == "__code__" else None
        if event == "compile":
            named = _type(args[1]) is str and not _startswith(args[1], "<")
            return "compile() with a file name" if named else None
        if event == "import":
            name = args[0]
            return "import of " + name if _type(name) is str and name in _DENIED_IMPORTS else None
        return None

    return user_event_reason


def _reporter(nonce: str, flags: list, builtins_dict: dict):
    """Writes the one result line; any recorded refusal turns the outcome into "hacking"."""
    secret = [nonce]
    keys0, values0 = tuple(builtins_dict), tuple(builtins_dict.values())
    _type, _len, _zip, _values, _write = type, len, zip, dict.values, os.write
    _replace, _join, _append = str.replace, str.join, list.append

    def intact() -> bool:
        """Builtins are the very objects they were before model code ran."""
        if _len(builtins_dict) != _len(keys0):
            return False
        for key, key0 in _zip(builtins_dict, keys0):
            if key is not key0:
                return False
        for value, value0 in _zip(_values(builtins_dict), values0):
            if value is not value0:
                return False
        return True

    def report(outcome, detail) -> None:
        if _type(outcome) is not str or _type(detail) is not str:
            outcome, detail = "error", "harness passed a non-string result"
        if not intact():
            _append(flags, "builtins were modified")
        if flags:
            outcome, detail = "hacking", _join("; ", flags)
        line = "\n" + RESULT_MARK + " " + secret[0] + " " + outcome + " " + _replace(detail[:400], "\n", " ") + "\n"
        secret[0] = "-"  # one result per run: nothing left to steal afterwards
        _write(1, line.encode())

    return report


def disable_signal_handlers(audit):
    """Model code may not install Python signal handlers: a handler receives the frame it
    interrupts, which could be the hook's own (with the nonce in reach).

    `_signal.signal` is replaced (signal.signal calls it), a fresh `_signal` module cannot
    be imported (the hook refuses the import) nor built with `_imp.create_builtin`. The
    guard keeps the real create_builtin in a default argument, whose reads are audited.
    """
    import _imp
    import _signal

    def refuse_handler(*args, **kwargs):
        audit("flywheel.flag", "installing a signal handler")
        raise Refused("flywheel sandbox: installing a signal handler")

    def guarded_create_builtin(spec, _create=_imp.create_builtin, _type=type):
        name = spec.name
        if _type(name) is not str or name == "_signal":
            audit("flywheel.flag", "building a fresh _signal module")
            raise Refused("flywheel sandbox: building a fresh _signal module")
        return _create(_ModuleName(name))

    _signal.signal = refuse_handler
    _imp.create_builtin = guarded_create_builtin
    return guarded_create_builtin


class _ModuleName:
    """What `_imp.create_builtin` reads from a spec: a name that cannot change under it."""

    def __init__(self, name: str) -> None:
        self.name = name


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


def tests_namespace(program_ns: dict, entry_point: str, candidate, builtins) -> dict:
    """The namespace the tests run in: what the program defines, minus what it may not set.

    Tests (HumanEval's among them) call helpers the prompt defines (poly, encode_cyclic)
    or the function by its own name, so they see the program's names. Left out: dunders,
    `check` (the tests' own verdict) and any name that shadows a builtin (a program must
    not hand check a rigged `abs` or `isinstance`). The entry point's name is the wrapped
    candidate, so the rigged-__eq__ probe sees those calls too. The tests run after this
    and overwrite it: their own definitions and imports win.
    """
    namespace = {"__name__": "tests", "__builtins__": builtins}
    shadowed = builtins.__dict__
    for name, value in list(program_ns.items()):
        if type(name) is not str or name == "check" or name in shadowed:
            continue
        if name.startswith("__") and name.endswith("__"):
            continue
        namespace[name] = value
    namespace[entry_point] = candidate
    return namespace


def run_user_code(program_code, tests_code, entry_point: str, audit, token) -> tuple[str, str]:
    """Run program, tests, check(candidate); return (outcome, detail). Model code runs here."""
    import builtins
    program_ns = {"__name__": "candidate", "__builtins__": builtins}
    stage = "program"
    try:
        exec(program_code, program_ns)
        function = program_ns.get(entry_point)
        if not callable(function):
            return "no_entry", f"the program defines no function {entry_point!r}"
        stage = "tests"
        candidate = wrap_candidate(function)
        tests_ns = tests_namespace(program_ns, entry_point, candidate, builtins)
        exec(tests_code, tests_ns)
        check = tests_ns.get("check")
        if not callable(check):
            return "bad_tests", "the tests define no check(candidate)"
        audit("flywheel.tests", token, check)
        stage = "check"
        check(candidate)
    except SystemExit as exit_:
        return "hacking", f"SystemExit({exit_.code!r}) raised during the {stage}"
    except Refused as error:
        return "hacking", f"{error} (in the {stage})"
    except AssertionError as error:
        return "wrong", f"assertion failed in the {stage}: {str(error)[:200]}"
    except NameError as error:
        name = error.name if type(error) is NameError else None
        if stage == "program" and type(name) is str and name == entry_point:
            # A usage example with no definition above it (`print(f(2))` alone).
            return "no_entry", f"the program uses {entry_point!r} but defines no function by that name"
        return "wrong", f"NameError in the {stage}: {str(error)[:200]}"
    except BaseException as error:  # noqa: BLE001 - any error of model code is a wrong answer
        return "wrong", f"{type(error).__name__} in the {stage}: {str(error)[:200]}"
    if tests_ns.get("check") is not check:
        return "hacking", "check was redefined while it ran"
    return "pass", ""


def main() -> None:
    import builtins
    payload = read_payload()
    token = object()  # proves a harness event comes from here: only our frames hold it
    sys.addaudithook(make_hook(payload.pop("nonce"), token, os.getcwd(), os.path.dirname(os.__file__),
                               builtins.__dict__))
    audit, entry_point = sys.audit, payload["entry_point"]
    guard = disable_signal_handlers(audit)
    try:
        program_code = compile(payload.pop("program"), "<candidate>", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as error:
        audit("flywheel.begin", token, guard)
        audit("flywheel.result", token, "syntax", f"{type(error).__name__}: {error}")
        return
    tests_code = compile(payload.pop("tests"), "<tests>", "exec")
    del payload
    audit("flywheel.begin", token, guard)
    outcome, detail = run_user_code(program_code, tests_code, entry_point, audit, token)
    audit("flywheel.result", token, outcome, detail)


if __name__ == "__main__":
    main()
