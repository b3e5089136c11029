"""tune and advise: pick a drafting setting for an engine on this machine, and say whether speculation pays."""

from __future__ import annotations

import json
from pathlib import Path

import click

from trtspec.cli.app import EXISTING_DIR, SPIN_HELP, _sampling_flag, cli, user_errors
from trtspec.cli.bench import _csv


@cli.command()
@click.argument("engine", type=EXISTING_DIR)
@click.option("--prompt-set", default="sharegpt-grounded", show_default=True,
              help="Calibrate on its tune split, measure on its measure split (sets without splits: the first "
                   "--evaluation prompts, as `bench --limit N` takes them, spread across the set's categories, "
                   "are measured; the next --calibration of that order calibrate).")
@click.option("--budget", "budgets", callback=_csv(int), default="4,8,16,32", show_default=True, metavar="4,8,16,32",
              help="Draft nodes per step to try (those over the engine's K are left out).")
@click.option("--calibration", type=click.IntRange(min=1), default=16, show_default=True,
              help="Calibration prompts, decoded once and replayed.")
@click.option("--evaluation", type=click.IntRange(min=1), default=8, show_default=True,
              help="Held-out prompts the best candidates are measured on.")
@click.option("--candidates", type=click.IntRange(min=1), default=3, show_default=True,
              help="Best predicted settings measured (with plain decoding, each method's best and the shipped tree).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True, help="Tokens per prompt.")
@click.option("--threads", type=int, default=2, show_default=True, help="ONNX Runtime intra-op threads.")
@click.option("--spin/--no-spin", default=None, help=SPIN_HELP)
@click.option("--write-recipe", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the winner as a complete recipe (`trtspec recipe run FILE`): its drafter, K / node budget, "
                   "tree, deploy.method and bench.methods set into FILE when it is a recipe already, else into "
                   "--recipe's copy, else into one made from the engine's manifest and checkpoint record.")
@click.option("--recipe", "template", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="--write-recipe: the recipe to start from (e.g. the one that built ENGINE).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--no-progress", is_flag=True, help="No progress bars on stderr.")
@user_errors
def tune(engine: Path, write_recipe: Path | None, template: Path | None, as_json: bool, no_progress: bool,
         **flags) -> None:
    """Predict each drafting setting's tokens/s from the verify curve and τ replayed over calibration prompts
    (ngram / suffix per node budget; Medusa and EAGLE-1 engines: the Medusa paper's greedy tree per budget over the
    heads' / the teacher-forced draft's ranks), measure the best on held-out prompts, print predicted beside measured
    and the winner."""
    from trtspec.recipe import check_target, write_winner_recipe
    from trtspec.tune import TuneOptions, format_tune, run_tune

    if template is not None and write_recipe is None:
        raise click.UsageError("--recipe is the template of --write-recipe FILE: pass --write-recipe too")
    if write_recipe is not None:
        check_target(engine, write_recipe, template)  # before the run, not after it

    report = run_tune(TuneOptions(engine=engine, show_progress=not no_progress, **flags),
                      show=lambda line: click.echo(line, err=True))
    click.echo(json.dumps(report, indent=1) if as_json else "\n".join(format_tune(report)))
    if write_recipe is not None:
        write_winner_recipe(report, write_recipe, template)
        click.echo(f"wrote {write_recipe} (winner {report['winner']['name']}): `trtspec recipe run {write_recipe}`",
                   err=True)


@cli.command()
@click.argument("engine", type=EXISTING_DIR)
@click.option("--prompt-set", default="mt-bench", show_default=True,
              help="Prompts like the traffic's: a known set (its measure split) or a .jsonl file.")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="The traffic's temperature.",
              callback=lambda ctx, param, value: _sampling_flag(param, value))
@click.option("--concurrency", type=click.IntRange(min=1), default=1, show_default=True,
              help="The traffic's concurrent requests (in process: at most the engine's max_batch_size).")
@click.option("--method", "methods", callback=_csv(str), metavar="A,B",
              help="Candidates (default: the engine's own drafter, ngram and suffix where it runs them).")
@click.option("--limit", type=click.IntRange(min=1), default=4, show_default=True,
              help="Prompts measured (as `bench --limit` takes them).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True, help="Tokens per prompt.")
@click.option("--threads", type=int, default=2, show_default=True, help="ONNX Runtime intra-op threads.")
@click.option("--spin/--no-spin", default=None, help=SPIN_HELP)
@click.option("--schedule", is_flag=True,
              help="Instead: the draft length worth drafting at each batch size (ngram, or the one --method, at "
                   "K, K/2, ... 1 against plain decoding per --levels), as the LLM API's draft_len_schedule for "
                   "`deploy --flavour llmapi`; measured on this CPU engine, a starting point for the GPU host.")
@click.option("--levels", callback=_csv(int), metavar="1,2,4", help="--schedule: the concurrency levels (default: "
                                                                   "1, 2, 4, ... up to the engine's max_batch_size).")
@click.option("--json", "as_json", is_flag=True, help="Print the advice as JSON (with the bench report behind it).")
@click.option("--no-progress", is_flag=True, help="No progress bar on stderr.")
@user_errors
def advise(engine: Path, methods, as_json: bool, no_progress: bool, schedule: bool, levels, **flags) -> None:
    """Go / no-go for speculation on this engine and traffic, with the measured reasons (acceptance, output
    length, temperature, concurrency on the batch verify curve, drafting overhead, TTFT) and the method to use;
    with --schedule, the draft length per batch size for the LLM API flavour."""
    from trtspec.errors import ConfigError
    from trtspec.tune import AdviseOptions, format_advice, run_advise

    if schedule:
        from trtspec.tune import ScheduleOptions, format_schedule, measure_schedule

        if len(methods or ()) > 1:
            raise ConfigError("--schedule measures one drafter: pass one --method (ngram or suffix)")
        if flags.pop("concurrency") != 1:
            raise ConfigError("--schedule measures every level of --levels; drop --concurrency")
        result = measure_schedule(ScheduleOptions(engine=engine, levels=tuple(levels or ()),
                                                  show_progress=not no_progress,
                                                  **({"method": methods[0]} if methods else {}), **flags),
                                  show=lambda line: click.echo(line, err=True))
        click.echo(json.dumps(result, indent=1) if as_json else "\n".join(format_schedule(result)))
        return
    if levels:
        raise ConfigError("--levels applies to --schedule")
    advice = run_advise(AdviseOptions(engine=engine, methods=methods or (), show_progress=not no_progress, **flags),
                        show=lambda line: click.echo(line, err=True))
    click.echo(json.dumps(advice, indent=1) if as_json else "\n".join(format_advice(advice)))
