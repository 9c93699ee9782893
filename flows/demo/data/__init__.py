"""`flywheel demo-data`: realistic failure logs with known defects planted in known
places (`generate`), evaluation sets kept apart from them (`evalsets`, `guard`), and
the task generators per domain (`domains` -> `math_tasks`, `code*`, `json_tasks`)."""
