"""Release: is the candidate better than production, and if so, serve it.

Reads: `models`, `eval_items` (newest version of every set), `tasks` (the held-out
`fresh-failures`), `rollouts` of the candidate's lineage. Writes: `evaluations`,
`gate_decisions`, `models`.

1. `evaluate`  samples both models G times on every evaluation item and scores them
               with the verifiers; items that a training task of the candidate's
               lineage copies are scored but kept out of every headline number
               (tasks.curate.decontaminate), infrastructure failures out of n;
               pass@k by the unbiased estimator (`passk`). Optionally, production's
               rows on the registered sets are copied from its evaluation in an earlier
               cycle under the same settings rather than sampled again (`reuse`).
2. `gate`      the pure decision (`gate.decide`): a paired bootstrap over items; promote
               only when the interval's lower bound clears `min_gain` and no domain
               visibly regresses. The decision and its reason are a `gate_decisions` row.
3. `promote`   applies the decision to `models` in one commit: the candidate becomes
               production (the old one retired) or rejected; a manual promotion or
               rollback goes through the same function, recorded as manual.
`models` is the model registry: where each version's folder lives, locally or in the
bucket, and which one is production. `retention`, called by lake maintenance when
asked, deletes the weights of models nothing serves and marks their rows.
"""
