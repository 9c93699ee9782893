"""The bubblewrap sandbox that runs untrusted code: `runner.run_python` is the one entry
point; `pool` keeps warm sandboxed workers, `worker` is the program inside each (and
the framing it shares with the host), `cgroup` bounds each worker's pids and memory."""
