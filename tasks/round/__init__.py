"""The training round: rollout -> verify -> train, `rounds` times per cycle.

Reads: `tasks` (not held out, not retired), `models`. Writes: `rollouts`, `verdicts`,
`routes`, `train_steps`, `models` (a candidate), each stage in one DuckLake commit.

1. `rollout`  picks tasks (domains round-robin; tasks whose recent pass rate is strictly
              between 0 and 1 first, then unseen ones; retired ones never) and samples
              them in waves through trainer.engine (vLLM; transformers as the
              reference), keeping the exact prompt and completion token ids sampled:
              `first_samples` each (fewer where the task's recent samples, or its
              domain's, all agreed), scored at once, then the rest of the group only
              where the route is undecided (`adaptive`). Each task is routed by
              difficulty (`routing`: rl, sft, skip, retire) and the round's rollouts,
              verdicts and routes land together.
2. `verify`   scores whatever rollout of the round has no verdict yet with its task's
              verifier (verifiers.registry) through `scoring`: verifiers that run no
              user code score in process; sandboxed code fans out to Dask.
3. `train`    exports the round's scored rollouts and its `sft` tasks' references
              (`train.export_sft`), runs one DeepSpeed job (trainer.launch): GRPO on the
              groups with reward variance plus the references' NLL (trainer.sft), and
              records its per-step metrics and the new candidate model. A round with
              neither learns nothing and says so.
Ids are content hashes, so rerunning a round writes nothing new. `checkpoints` is not a
stage: lake maintenance calls it to delete the training checkpoints of completed cycles.
"""
