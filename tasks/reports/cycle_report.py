"""The cycle report: what happened to every row, how the models scored, what the gate did.

`build_report` reads the lake (SQL only, so a report can be rebuilt for any past cycle
or snapshot) and writes FLYWHEEL_HOME/reports/<cycle_id>/: `funnel.csv`,
`evaluation.csv`, `training.png` (reward mean +- std, KL, entropy, response length
per training step), `pass_at_1.png` (pass@1 per cycle and model) and `summary.md`
(the two tables, the gate's decision, the charts). `publish_report` turns the same
report into Prefect artifacts; call it inside a flow run. Prefect 3.7's image
artifact takes only a URL, so the charts go up as `file://` image artifacts (useful
where the UI runs beside the files) and, embedded as data URIs, inside the markdown.

Numbers follow tasks.release.evaluate: samples with infrastructure verdicts (timeout,
sandbox_error) are not counted, an item's score is its pass rate, pass@1 is the mean
over items; contaminated rows are left out.
Not here: deciding anything; charts are drawn with matplotlib's Agg backend (no display).
"""
from __future__ import annotations

import base64
import csv
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import matplotlib

matplotlib.use("Agg")  # files only, never a window: reports run in workers without a display
import matplotlib.pyplot as plt  # noqa: E402

from storage.config_file import lake_settings  # noqa: E402
from storage.lake import open_lake  # noqa: E402
from tasks.release.decisions import recorded_decision  # noqa: E402
from tasks.release.gate import GateConfig, bootstrap_ci  # noqa: E402
from verifiers.verdict import INFRA_STATUSES_SQL  # noqa: E402

_JUDGED = f"status NOT IN {INFRA_STATUSES_SQL}"
# Contaminated items are scored but never counted; rows written before the flag
# existed (NULL) count as clean.
_CLEAN = "contaminated IS NOT TRUE"


@dataclass(frozen=True)
class Report:
    cycle_id: str
    folder: Path
    funnel: list[dict]
    evaluation: list[dict]
    decisions: list[dict]  # models written by this cycle: status and reason
    gate: dict | None
    markdown: str
    charts: dict[str, Path] = field(default_factory=dict)


def funnel(con: duckdb.DuckDBPyConnection, cycle_id: str) -> list[dict]:
    """Row counts of each stage this cycle, in pipeline order."""
    row = con.execute("""
        SELECT (SELECT count(*) FROM lake.failure_logs WHERE cycle_id = $c)
                 + (SELECT count(*) FROM lake.quarantine WHERE cycle_id = $c),
               (SELECT count(*) FROM lake.quarantine WHERE cycle_id = $c),
               (SELECT count(*) FROM lake.decisions WHERE cycle_id = $c AND decision = 'duplicate'),
               (SELECT count(*) FROM lake.decisions WHERE cycle_id = $c AND decision = 'near_duplicate'),
               (SELECT count(*) FROM lake.decisions WHERE cycle_id = $c AND decision = 'contaminated'),
               (SELECT count(*) FROM lake.decisions WHERE cycle_id = $c AND decision = 'unverifiable'),
               (SELECT count(*) FROM lake.decisions WHERE cycle_id = $c AND decision = 'kept'),
               (SELECT count(*) FROM lake.tasks WHERE cycle_id = $c),
               (SELECT count(*) FROM lake.rollouts WHERE cycle_id = $c),
               (SELECT count(*) FROM lake.verdicts WHERE cycle_id = $c),
               -- each step row repeats its job's kept-group count: count each job once
               (SELECT coalesce(sum(kept), 0) FROM (SELECT max(groups_kept) AS kept FROM lake.train_steps
                                                    WHERE cycle_id = $c GROUP BY policy_version))
        """, {"c": cycle_id}).fetchone()
    stages = ("log lines", "quarantined", "duplicate", "near duplicate", "contaminated", "unverifiable",
              "kept", "tasks", "rollouts", "verified", "groups trained")
    return [{"stage": s, "rows": int(n)} for s, n in zip(stages, row)]


def item_scores(con: duckdb.DuckDBPyConnection, cycle_id: str | None = None) -> list[tuple]:
    """(cycle_id, policy_version, eval_set, item_id, score) of every judged item."""
    where = "cycle_id = ?" if cycle_id is not None else "? IS NULL"
    return con.execute(f"""
        SELECT cycle_id, policy_version, eval_set, item_id, avg(passed::DOUBLE) FILTER (WHERE {_JUDGED})
        FROM lake.evaluations WHERE {where} AND {_CLEAN}
        GROUP BY ALL HAVING count(*) FILTER (WHERE {_JUDGED}) > 0
        ORDER BY ALL""", [cycle_id]).fetchall()


def evaluation_table(con: duckdb.DuckDBPyConnection, cycle_id: str, ci: GateConfig) -> list[dict]:
    """pass@1 with its bootstrap interval, per model and evaluation set, plus each model's total."""
    groups: dict[tuple[str, str], list[float]] = {}
    for _, policy, eval_set, _, score in item_scores(con, cycle_id):
        groups.setdefault((policy, eval_set), []).append(score)
        groups.setdefault((policy, "(all)"), []).append(score)
    out = []
    for (policy, eval_set), scores in sorted(groups.items()):
        low, high = bootstrap_ci(scores, ci)
        out.append({"policy_version": policy, "eval_set": eval_set, "items": len(scores),
                    "pass@1": round(sum(scores) / len(scores), 4), "low": round(low, 4), "high": round(high, 4)})
    return out


def model_decisions(con: duckdb.DuckDBPyConnection, cycle_id: str) -> list[dict]:
    rows = con.execute("SELECT policy_version, parent_version, status, reason FROM lake.models "
                       "WHERE cycle_id = ? ORDER BY created_at, policy_version", [cycle_id]).fetchall()
    return [dict(zip(("policy_version", "parent_version", "status", "reason"), r)) for r in rows]


def training_chart(con: duckdb.DuckDBPyConnection, cycle_id: str, path: Path) -> Path:
    """Reward mean +- std, KL, entropy and response length over this cycle's training steps."""
    rows = con.execute("""
        SELECT s.reward_mean, s.reward_std, s.kl, s.entropy, s.resp_len_mean, s.kl_reference
        FROM lake.train_steps s LEFT JOIN lake.models m USING (policy_version)
        WHERE s.cycle_id = ? ORDER BY m.created_at NULLS LAST, s.policy_version, s.step""", [cycle_id]).fetchall()
    x = list(range(1, len(rows) + 1))  # rounds follow each other: one running step count
    mean, std, kl, entropy, length = ([float("nan") if v is None else v for v in column]
                                      for column in (list(zip(*rows))[:5] if rows else [()] * 5))
    fig, axes = plt.subplots(2, 2, figsize=(10, 6), sharex=True)
    axes[0, 0].plot(x, mean, label="reward mean")
    axes[0, 0].fill_between(x, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                            alpha=0.25, label="± std")
    axes[0, 0].legend(loc="best")
    for ax, values, title in ((axes[0, 1], kl, kl_title(r[5] for r in rows)), (axes[1, 0], entropy, "entropy"),
                              (axes[1, 1], length, "response length (tokens)")):
        ax.plot(x, values)
        ax.set_title(title)
    axes[0, 0].set_title("reward")
    for ax in axes[1]:
        ax.set_xlabel("training step")
    if not rows:
        fig.suptitle(f"cycle {cycle_id}: no training steps")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def kl_title(kl_reference: Iterable[bool | None]) -> str:
    """What the steps' `kl` is: the k3 estimate to a frozen reference model only where a step
    says so (`kl_reference`: kl_coef > 0); otherwise to the policy that sampled the rollouts,
    i.e. how far the job moved (trainer/loss.py)."""
    return "KL to reference (k3)" if any(kl_reference) else "KL to rollout policy (k3)"


def pass_at_1_by_cycle(con: duckdb.DuckDBPyConnection) -> list[dict]:
    """pass@1 per (cycle, model), cycles in start order; role = candidate when the cycle made the model."""
    per: dict[tuple[str, str], list[float]] = {}
    for cycle, policy, _, _, score in item_scores(con):
        per.setdefault((cycle, policy), []).append(score)
    order = {c: i for i, (c,) in enumerate(con.execute(
        "SELECT cycle_id FROM lake.cycles GROUP BY cycle_id ORDER BY min(started_at), cycle_id").fetchall())}
    made = {(c, p) for p, c in con.execute("SELECT policy_version, cycle_id FROM lake.models").fetchall()}
    rows = [{"cycle_id": c, "policy_version": p, "pass@1": sum(s) / len(s),
             "role": "candidate" if (c, p) in made else "production"} for (c, p), s in per.items()]
    return sorted(rows, key=lambda r: (order.get(r["cycle_id"], len(order)), r["cycle_id"], r["role"]))


def pass_at_1_chart(con: duckdb.DuckDBPyConnection, path: Path) -> Path:
    rows = pass_at_1_by_cycle(con)
    cycles = list(dict.fromkeys(r["cycle_id"] for r in rows))
    fig, ax = plt.subplots(figsize=(7, 4))
    for role, marker in (("production", "o"), ("candidate", "s")):
        pts = [(cycles.index(r["cycle_id"]), r["pass@1"]) for r in rows if r["role"] == role]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=role)
    ax.set_xticks(range(len(cycles)), cycles, rotation=30, ha="right")
    ax.set_ylim(0, 1)
    ax.set_ylabel("pass@1 (clean items)")
    ax.set_title("pass@1 per cycle")
    if rows:
        ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def _md_table(rows: list[dict]) -> str:
    if not rows:
        return "_none_\n"
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join("" if r[h] is None else str(r[h]) for h in head) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def summary_markdown(cycle_id: str, funnel_rows: list[dict], evaluation: list[dict], decisions: list[dict],
                     gate: dict | None, images: dict[str, str]) -> str:
    """The report as markdown; `images` maps a chart name to its link (file name or data URI)."""
    parts = [f"# flywheel cycle `{cycle_id}`\n", "## Funnel\n", _md_table(funnel_rows),
             "## Evaluation (pass@1, bootstrap interval over items)\n", _md_table(evaluation), "## Gate\n"]
    if gate is not None:
        parts.append(f"**{'PROMOTED' if gate['promoted'] else 'REJECTED'}** — {gate['reason']}\n")
        parts.append(_md_table([{k: (round(v, 4) if isinstance(v, float) else v) for k, v in d.items()}
                                for d in gate["domains"]]))
    parts.append(_md_table(decisions))
    parts.append("## Charts\n")
    parts += [f"![{name}]({link})\n" for name, link in images.items()]
    return "\n".join(parts)


def build_report(con: duckdb.DuckDBPyConnection, cycle_id: str, home: Path, ci: GateConfig | None = None) -> Report:
    """Write the cycle's report files under home/reports/<cycle_id>/ and return their content."""
    gate = recorded_decision(con, cycle_id)
    folder = Path(home) / "reports" / _safe(cycle_id)
    folder.mkdir(parents=True, exist_ok=True)
    funnel_rows = funnel(con, cycle_id)
    evaluation = evaluation_table(con, cycle_id, ci or GateConfig())
    decisions = model_decisions(con, cycle_id)
    charts = {"training": training_chart(con, cycle_id, folder / "training.png"),
              "pass_at_1": pass_at_1_chart(con, folder / "pass_at_1.png")}
    _write_csv(folder / "funnel.csv", funnel_rows)
    _write_csv(folder / "evaluation.csv", evaluation)
    gate_dict = gate.to_dict() if gate is not None else None
    if gate_dict is not None:
        (folder / "gate.json").write_text(json.dumps(gate_dict, indent=2))
    markdown = summary_markdown(cycle_id, funnel_rows, evaluation, decisions, gate_dict,
                                {name: path.name for name, path in charts.items()})
    (folder / "summary.md").write_text(markdown)
    return Report(cycle_id, folder, funnel_rows, evaluation, decisions, gate_dict, markdown, charts)


def publish_report(report: Report) -> list:
    """Prefect artifacts of the report (call inside a flow or task run); returns their ids."""
    from prefect.artifacts import create_image_artifact, create_markdown_artifact, create_table_artifact

    embedded = {name: "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()
                for name, path in report.charts.items()}
    markdown = summary_markdown(report.cycle_id, report.funnel, report.evaluation, report.decisions,
                                report.gate, embedded)
    ids = [create_table_artifact(report.funnel, key="flywheel-funnel",
                                 description=f"cycle {report.cycle_id}: rows per stage"),
           create_table_artifact(report.evaluation or [{"policy_version": None}], key="flywheel-evaluation",
                                 description=f"cycle {report.cycle_id}: pass@1 with intervals"),
           create_markdown_artifact(markdown, key="flywheel-report",
                                    description=f"cycle {report.cycle_id}: report ({report.folder})")]
    for name, path in report.charts.items():
        ids.append(create_image_artifact(path.resolve().as_uri(), key=f"flywheel-{name.replace('_', '-')}-chart",
                                         description=f"cycle {report.cycle_id}: {name}"))
    return ids


def _write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        if rows:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


def _safe(cycle_id: str) -> str:
    """A folder name for the cycle: ids are ours, but a path separator must never escape home."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", cycle_id) or "_"


def report_cycle(cycle_id: str) -> Path:
    """Build the cycle's report from the lake and publish it as Prefect artifacts."""
    settings = lake_settings()
    con = open_lake(settings, read_only=True)
    try:
        report = build_report(con, cycle_id, settings.home)
    finally:
        con.close()
    publish_report(report)
    return report.folder


def publish_evaluation(evaluation_id: str, models: dict, applied: dict | None) -> None:
    """An on-demand evaluation's pass@1 table and the gate's answer as Prefect artifacts."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    con = open_lake(lake_settings(), read_only=True)
    try:
        table = evaluation_table(con, evaluation_id, GateConfig())
        decision = recorded_decision(con, evaluation_id, models["candidate"])
    finally:
        con.close()
    create_table_artifact(table or [{"policy_version": None}], key="flywheel-evaluation",
                          description=f"evaluation {evaluation_id}: pass@1 with intervals")
    verdict = (f"**{'PROMOTE' if decision.promoted else 'REJECT'}** — {decision.reason}" if decision
               else "no decision")
    action = ("applied to `models`: " + applied["reason"] if applied is not None
              else "not applied (`apply_gate` is off); `models` is unchanged")
    create_markdown_artifact(
        f"# evaluation `{evaluation_id}`\n\ncandidate `{models['candidate']}` against production "
        f"`{models['production']}`\n\n{verdict}\n\n{action}\n",
        key="flywheel-gate", description=f"evaluation {evaluation_id}: the gate's decision")
