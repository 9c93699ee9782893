"""The training round: rollout -> verify -> train, `rounds` times per cycle.

Reads: `tasks` (not held out), `models`. Writes: `rollouts`, `verdicts`,
`train_steps`, `models` (a candidate), each stage in one DuckLake commit.

1. `rollout`  picks tasks (domains round-robin; tasks whose recent pass rate is strictly
              between 0 and 1 first, then unseen ones) and samples G completions each
              with the policy through trainer.engine (vLLM; transformers as the
              reference), keeping the exact prompt and completion token ids sampled.
2. `verify`   scores every unscored rollout of the round with its task's verifier
              (verifiers.registry) through `scoring`: verifiers that run no user code
              score in process; sandboxed code fans out to Dask.
3. `train`    exports the round's scored rollouts, runs one DeepSpeed GRPO job
              (trainer.launch) and records its per-step metrics and the new
              candidate model. A round whose groups all have one reward learns nothing
              and says so.
Ids are content hashes, so rerunning a round writes nothing new.
"""
