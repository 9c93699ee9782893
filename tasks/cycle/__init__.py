"""Cycle bookkeeping: the `[cycle]` configuration every entry point reads (`config`),
which stages of a cycle have finished (`state`: `cycle_stages`, `cycles`), so a rerun
continues from the first stage that did not finish, and the Prefect layer
(`prefect_tasks`: one generic task runs any stage of tasks.stages.STAGES)."""
