"""recipe check / run: one YAML file for a whole pipeline."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from trtspec.cli.app import cli, user_errors

RECIPE_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


@cli.group()
def recipe() -> None:
    """Recipes: one YAML file for base, drafter, convert, build, deploy, serve, bench and its baseline."""


@recipe.command("check")
@click.argument("file", type=RECIPE_FILE)
@click.option("--workdir", default=".", show_default=True, help="Folder the printed commands write under.")
@user_errors
def recipe_check(file: Path, workdir: str) -> None:
    """Validate a recipe and print the commands of convert, build and deploy, one per line.

    Then, on stderr, each path the recipe names that does not exist here (its paths are relative to the recipe
    file)."""
    from trtspec.recipe import command_lines, load_recipe, missing_paths

    for line in command_lines(load_recipe(file), workdir):
        click.echo(line)
    for line in missing_paths(file):
        click.echo(f"warning: {line}", err=True)


@recipe.command("run")
@click.argument("file", type=RECIPE_FILE)
@click.option("--stages", help="Comma-separated stages to run, in pipeline order: convert, build, deploy, serve, "
                               "bench (default: every stage the recipe has).")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=Path("recipe-runs"),
              show_default=True, help="Each stage writes WORKDIR/NAME/<its folder>; stamps and logs beside them.")
@click.option("--force", is_flag=True, help="Run convert / build / deploy even when their stamps say nothing changed.")
@click.option("--dry-run", is_flag=True, help="Print each stage's commands; run nothing.")
@click.option("--gate", is_flag=True, help="bench: measure the baseline's slice (spec and plain alternating) and exit 1 "
                                           "when a figure falls past its tolerance or an output differs from plain "
                                           "decoding; writes bench/gate.json and gate.png.")
@click.option("--update-baseline", is_flag=True, help="With --gate: write the measured figures into the recipe's "
                                                      "baseline (comments and key order kept).")
@click.option("--rehearse", is_flag=True,
              help="A trtllm recipe on this host: plan its TensorRT-LLM engine, build a CPU engine of the same "
                   "checkpoint, deploy the GPU repository with it standing in for tensorrt_llm and serve it in the "
                   "real tritonserver (`deploy --rehearse`); the bench stage stays the GPU host's.")
@click.option("--json", "as_json", is_flag=True, help="Print the run's outcome as JSON at the end.")
@user_errors
def recipe_run(file: Path, stages: str | None, workdir: Path, force: bool, dry_run: bool, gate: bool,
               update_baseline: bool, rehearse: bool, as_json: bool) -> None:
    """Run a recipe's stages in order, skipping convert / build / deploy whose inputs and settings are unchanged
    since their last success; exit 1 when a stage fails or the gate does."""
    from trtspec.recipe import RunOptions, dry_run_lines, load_recipe, run_recipe, selected_stages

    chosen = tuple(s.strip() for s in stages.split(",") if s.strip()) if stages else None
    if dry_run:
        recipe = load_recipe(file)
        recipe = recipe.rehearsal() if rehearse else recipe
        for line in dry_run_lines(recipe, workdir, selected_stages(recipe, chosen, gate=gate)):
            click.echo(line)
        return
    opts = RunOptions(recipe_file=file, workdir=workdir, stages=chosen, force=force, gate=gate,
                      update_baseline=update_baseline, rehearse=rehearse)
    report = run_recipe(opts, show=lambda line: click.echo(line, err=as_json))
    verdict = "passed" if report.passed else "FAILED"
    if as_json:
        click.echo(json.dumps({"recipe": report.recipe, "passed": report.passed, "seconds": round(report.seconds, 1),
                               "stages": [vars(o) for o in report.outcomes],
                               "gate": report.gate.to_dict() if report.gate is not None else None}, indent=2))
    else:
        click.echo(f"recipe {report.recipe}: {verdict} in {report.seconds:.1f} s")
    if not report.passed:
        sys.exit(1)
