"""The cycle report (`cycle_report`): what happened to every row of one cycle, how the
models scored, what the gate decided, as files under FLYWHEEL_HOME/reports/<cycle_id>/
and as Prefect artifacts."""
