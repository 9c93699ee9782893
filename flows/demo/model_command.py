"""`flywheel model init|sft`: build the tiny demo policy and warm-start it.

`init` writes a Hugging Face folder (tiny Llama + character tokenizer, no download);
`sft` trains a folder on (prompt, reference solution) pairs so GRPO starts from a
policy that is right sometimes. Both print one JSON line with what they did.
"""
from __future__ import annotations

import json
from pathlib import Path

import typer

model_app = typer.Typer(help="Build and warm-start the policy model.", no_args_is_help=True)


def quiet_transformers() -> None:
    """transformers' progress bars end without a newline and would glue onto our JSON line."""
    from transformers.utils import logging

    logging.disable_progress_bar()


@model_app.command("init")
def init_command(
    out: Path = typer.Option(..., "--out", help="Folder to write the model into."),
    hidden_size: int = typer.Option(128, help="Width of the tiny Llama."),
    layers: int = typer.Option(2, help="Number of transformer layers."),
    seed: int = typer.Option(0, help="Seed of the random initialisation."),
) -> None:
    """Build the tiny demo model and its tokenizer as a Hugging Face folder."""
    from transformers import AutoModelForCausalLM

    from flows.demo.tiny_model import ModelConfig, count_parameters, init_model

    quiet_transformers()
    cfg = ModelConfig(hidden_size=hidden_size, intermediate_size=4 * hidden_size,
                      num_hidden_layers=layers, seed=seed)
    folder = init_model(out, cfg)
    params = count_parameters(AutoModelForCausalLM.from_pretrained(str(folder)))
    typer.echo(json.dumps({"model": str(folder), "parameters": params}))


@model_app.command("sft")
def sft_command(
    model: Path = typer.Option(..., "--model", help="Hugging Face folder to start from."),
    data: Path = typer.Option(..., "--data", help='JSON lines of {"prompt": ..., "completion": ...}.'),
    out: Path = typer.Option(..., "--out", help="Folder for the warm-started model."),
    steps: int = typer.Option(250, help="Optimiser steps."),
    batch_size: int = typer.Option(128, help="Pairs per step."),
    lr: float = typer.Option(1e-3, help="AdamW learning rate."),
    seed: int = typer.Option(0),
) -> None:
    """Supervised warm start on reference solutions (loss on the answer tokens only)."""
    from flows.demo.sft import SFTConfig, run_sft

    quiet_transformers()
    result = run_sft(model, data, out, SFTConfig(steps=steps, batch_size=batch_size, lr=lr, seed=seed))
    typer.echo(json.dumps({"model": str(out), **result}))
