"""`flywheel model import|list|promote`: bring a model, see what exists, the manual override.

`import SOURCE` converts a Hugging Face folder or a `.gguf` file (or `smollm2`, the
bundled SmolLM2-135M-Instruct, or a PEFT adapter merged into its `--base`) into a plain
HF folder in the object store and records it with its source, sha256, size, context length and chat template
(tasks.release.models.import_model); `--production` also makes it the production model.
`list` shows every model with its parent, status, latest pass@1 and the reason of its
status. `promote VERSION` makes VERSION the production model whatever the gate said
(tasks.release.promote records it as a manual decision); promoting an older model is the rollback.
"""
from __future__ import annotations

from typing import Annotated

import duckdb
import typer
from rich.table import Table

from flows.cli.show import cell, plain, print_error, rich_console
from storage.config_file import ConfigError, lake_settings
from storage.lake import LakeError, open_lake


def model_import_command(
    source: Annotated[str, typer.Argument(help=(
        "A Hugging Face model folder, a .gguf file, `smollm2`, or a PEFT adapter folder (merged into --base)."))],
    # The choices are trainer.model_import.DTYPES, torch dtypes: listing them here would
    # import torch for every `flywheel` command, so the refusal of a wrong one lists them.
    dtype: Annotated[str, typer.Option(help="Weights' dtype in the stored folder; auto keeps a folder's own "
                                       "and dequantizes a GGUF to float32 (a wrong one is refused with "
                                       "the choices).")]
    = "auto",
    production: Annotated[bool, typer.Option("--production", help="Also make it the production model.")]
    = False,
    base: Annotated[str | None, typer.Option(help=(
        "For an adapter: the model it was trained on (a folder, a .gguf file, `smollm2`, or a version from "
        "`flywheel model list`); default: the folder its adapter_config.json names."))] = None,
) -> None:
    """Convert and store a model, record it in `models` (status imported, or production)."""
    from tasks.release.models import ModelFolderError, ModelNotFound, import_model
    from tasks.release.promote import ModelError, promote
    from trainer.model_import import ModelImportError

    console = rich_console()
    try:
        con = open_lake(lake_settings())
        try:
            version, new = import_model(con, lake_settings(), source, dtype, base=base)
            if production:
                promote(con, version, f"imported from {source}", manual=True)
            row = con.execute("SELECT status, parameters, context_length, uri FROM lake.models "
                              "WHERE policy_version = ?", [version]).fetchone()
        finally:
            con.close()
    except (ModelImportError, ModelFolderError, ModelError, ModelNotFound, OSError) as exc:
        print_error(console, exc)
        raise typer.Exit(1) from None
    except (ConfigError, LakeError, duckdb.Error) as exc:
        print_error(console, exc)
        raise typer.Exit(2) from None
    status, parameters, context, uri = row
    known = "" if new else " (already imported: nothing changed)"
    console.print(f"{plain(version)}{known}\n  status {status}, {parameters / 1e6:.1f}M parameters, "
                  f"context {context} tokens\n  {plain(uri)}")


def model_list_command() -> None:
    """Versions, parents, statuses and headline pass@1 of every model."""
    from tasks.release.promote import list_models

    console = rich_console()
    try:
        con = open_lake(lake_settings(), read_only=True)
        try:
            rows = list_models(con)
        finally:
            con.close()
    except (ConfigError, LakeError, duckdb.Error) as exc:
        print_error(console, exc)
        raise typer.Exit(2) from None
    table = Table(title="models")
    for name in ("version", "parent", "status", "pass@1", "evaluated in", "reason"):
        table.add_column(name, overflow="fold")
    for r in rows:
        score = "-" if r["pass@1"] is None else f"{r['pass@1']:.3f}"
        # its row and scores stay, its weights are gone: promote and load refuse it, so say so here
        status = r["status"] + (f", weights deleted {r['weights_deleted_at']:%Y-%m-%d}"
                                if r["weights_deleted_at"] else "")
        table.add_row(*map(cell, (r["policy_version"], r["parent_version"] or "-", status, score,
                                  r["evaluated_in"] or "-", r["reason"] or "")))
    console.print(table if rows else "no models yet: `flywheel model register DIR` makes one production (`flywheel demo` builds one)")


def model_promote_command(
    version: Annotated[str, typer.Argument(help=(
        "The policy_version to make production, or its first 6 or more characters."))],
    reason: Annotated[str, typer.Option("--reason", help="Why; stored with the model.")] = "no reason given",
) -> None:
    """Make VERSION the production model by hand (override or rollback), recorded as manual."""
    from tasks.release.models import ModelNotFound, resolve_version
    from tasks.release.promote import ModelError, promote

    console = rich_console()
    if not reason.strip():  # stored with the model: an override must say why
        print_error(console, "--reason must say why (it is stored with the model); leave it out for "
                             "'no reason given'")
        raise typer.Exit(2)
    try:
        con = open_lake(lake_settings())
        try:
            version = resolve_version(con, version)
            result = promote(con, version, reason, manual=True)
        finally:
            con.close()
    except (ModelError, ModelNotFound) as exc:
        print_error(console, exc)
        raise typer.Exit(1) from None
    except (ConfigError, LakeError, duckdb.Error) as exc:
        print_error(console, exc)
        raise typer.Exit(2) from None
    if not result.changed:
        console.print(f"{plain(version)} already is the production model; nothing changed")
        return
    retired = ", ".join(result.previous) or "none"
    console.print(f"{plain(version)} is now the production model (manual override); retired: {plain(retired)}")
