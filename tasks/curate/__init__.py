"""Curate: every undecided failure log becomes a task, or a `decisions` row saying why not.

Reads: `failure_logs` without a decision, `eval_items` (every registered version),
`tasks` of earlier cycles. Writes: `tasks`, `decisions`, `eval_coverage`,
`coverage_checks`, `minhash_signatures`, one DuckLake commit per chunk of
`chunk_logs` logs (`curation`).

Each log, in arrival order, gets the first decision that applies:
1. contaminated    its prompt copies an evaluation item: exact, n-gram overlap or
                   MinHash near duplicate (`decontaminate`; evidence names the item).
2. unverifiable    no verifier for it, or its reference fails its own verifier's gold
                   self-test (verifiers.registry).
3. duplicate       its normalised prompt is already a task (`similarity.normalize`:
                   the content hash is the task id).
4. near_duplicate  word-shingle Jaccard >= the MinHash threshold with an earlier task
                   (`similarity.minhash`, `similarity.bands`).
5. kept            it becomes a task (verifier + spec from its reference).

Beside the decisions: `evalsets` registers evaluation sets (versioned by content);
`coverage` records evaluation items that tasks of earlier cycles already copy (a set
registered after those tasks; only tasks newer than a version's `coverage_checks` mark
are checked); `holdout` keeps a stable share of kept tasks out of
training as the `fresh-failures` evaluation set.
"""
