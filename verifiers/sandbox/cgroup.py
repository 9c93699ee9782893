"""Per-worker pids and memory cgroups for the sandbox, on cgroup v1 or v2.

Why cgroups at all: the sandboxed uid maps to the host user that started bubblewrap,
root here, and the kernel exempts root from RLIMIT_NPROC, so only a pids cgroup stops a
fork or thread bomb. RLIMIT_AS bounds one process, not the 64 a bomb may fork, so a
memory cgroup bounds their sum (tmpfs pages of the work dir are charged there too).

Each warm worker (the bubblewrap process tree) lives in its own cgroup under
`<our cgroup>/flywheel-<host pid>/w<n>`; the host sets its limits to "the worker's own
tasks plus what one run may use" before each run, and kills every task in it when a
worker is retired. Runs on one worker are sequential and the previous run's processes are
gone before the next starts (its pid namespace died), so the worker cgroup bounds exactly
one run at a time. What this does not do: cpu or io controllers; the wall-clock timeout
and RLIMIT_CPU bound cpu time instead.
"""

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

_CONTROLLERS = ("pids", "memory")
_LIMIT_FILES = {  # controller -> (v1 file, v2 file)
    "pids": ("pids.max", "pids.max"),
    "memory": ("memory.limit_in_bytes", "memory.max"),
}


@dataclass
class CgroupParent:
    """Where worker cgroups are created; `dirs` is empty when none could be."""

    version: str  # "v1", "v2" or "none"
    dirs: dict[str, Path] = field(default_factory=dict)  # controller -> our flywheel-<pid> dir
    reason: str = ""  # why version is "none"

    def new_worker(self, name: str) -> "WorkerCgroup | None":
        if not self.dirs:
            return None
        paths = {}
        for controller, parent in self.dirs.items():
            path = parent / name
            path.mkdir(exist_ok=True)
            paths[controller] = path
        return WorkerCgroup(self.version, paths)

    def remove(self) -> None:
        for path in set(self.dirs.values()):
            _rmdir_retrying(path)


@dataclass
class WorkerCgroup:
    version: str
    paths: dict[str, Path]
    _limits: dict[str, int] = field(default_factory=dict)

    def procs_files(self) -> list[str]:
        return sorted({str(path / "cgroup.procs") for path in self.paths.values()})

    def task_count(self) -> int:
        return int((self.paths["pids"] / "pids.current").read_text())

    def set_limit(self, controller: str, value: int) -> None:
        if self._limits.get(controller) != value:  # one write per change, not per run
            v1_file, v2_file = _LIMIT_FILES[controller]
            name = v1_file if self.version == "v1" else v2_file
            (self.paths[controller] / name).write_text(str(value))
            self._limits[controller] = value

    def kill_all(self) -> None:
        """SIGKILL every task in the worker's cgroups until they are empty."""
        for _ in range(200):
            pids = set()
            for path in self.paths.values():
                try:
                    pids.update(int(p) for p in (path / "cgroup.procs").read_text().split())
                except FileNotFoundError:  # already removed
                    pass
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)

    def remove(self) -> None:
        self.kill_all()
        for path in self.paths.values():
            _rmdir_retrying(path)


def _rmdir_retrying(path: Path) -> None:
    # rmdir of a cgroup fails with EBUSY for a moment after its last task exits.
    for _ in range(100):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)


def _sweep_stale(base: Path) -> None:
    """Remove flywheel-<pid> cgroups left by processes that died without cleaning up."""
    for stale in base.glob("flywheel-*"):
        pid = stale.name.removeprefix("flywheel-")
        if not pid.isdigit() or Path(f"/proc/{pid}").exists():
            continue
        try:
            for worker in [p for p in stale.iterdir() if p.is_dir()]:
                WorkerCgroup("any", {"any": worker}).remove()
            _rmdir_retrying(stale)
        except OSError:
            pass  # another process is sweeping the same directory


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, super options) of every cgroup mount we can see."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fstype, _source, opts = (right.split() + ["", ""])[:3]
        if fstype in ("cgroup", "cgroup2"):
            found.append((left.split()[4], fstype, set(opts.split(","))))
    return found


def _own_cgroups() -> dict[str, str]:
    """Controller (or '' for v2) -> our cgroup path, from /proc/self/cgroup."""
    own = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    return own


def open_cgroup_parent() -> CgroupParent:
    """Create `flywheel-<pid>` under our own cgroups; v2 preferred, then v1, else none."""
    mounts, own, name = _mounts(), _own_cgroups(), f"flywheel-{os.getpid()}"
    reasons = []
    for point, fstype, _ in mounts:
        if fstype != "cgroup2":
            continue
        base = Path(point) / own.get("", "/").lstrip("/")
        try:
            available = (base / "cgroup.controllers").read_text().split()
            if "pids" not in available:
                raise OSError(f"pids controller not available in {base} (it is bound to cgroup v1)")
            wanted = " ".join(f"+{c}" for c in _CONTROLLERS if c in available)
            _sweep_stale(base)
            (base / "cgroup.subtree_control").write_text(wanted)
            (base / name).mkdir(exist_ok=True)
            (base / name / "cgroup.subtree_control").write_text(wanted)
            return CgroupParent("v2", {c: base / name for c in _CONTROLLERS if c in available})
        except OSError as exc:
            reasons.append(f"cgroup v2 at {point}: {exc}")
    dirs = {}
    for controller in _CONTROLLERS:
        for point, fstype, opts in mounts:
            if fstype == "cgroup" and controller in opts:
                path = Path(point) / own.get(controller, "/").lstrip("/") / name
                try:
                    _sweep_stale(path.parent)
                    path.mkdir(exist_ok=True)
                    dirs[controller] = path
                except OSError as exc:
                    reasons.append(f"cgroup v1 {controller} at {point}: {exc}")
    if "pids" in dirs:
        return CgroupParent("v1", dirs)
    for path in dirs.values():
        _rmdir_retrying(path)
    return CgroupParent("none", reason="; ".join(reasons) or "no cgroup filesystem with a pids controller is mounted")
