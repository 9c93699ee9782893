"""Cycle bookkeeping: the `[cycle]` configuration every entry point reads (`config`),
and which stages of a cycle have finished (`state`: `cycle_stages`, `cycles`), so a
rerun continues from the first stage that did not finish."""
