"""The example CI files in ci/ are documentation: they parse, every trtspec command they call exists with the options
they pass, every recipe they name ships and validates, and a GPU job's container is its recipe's version's."""

from __future__ import annotations

import shlex
from pathlib import Path

import click
import pytest
import yaml

from trtspec.cli import cli
from trtspec.engine.trtllm_versions import parse_version
from trtspec.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]
CI_FILES = sorted((ROOT / "ci").glob("*.yml"))


def _scripts(node) -> list[str]:
    """Every shell line of a GitHub Actions (`run:`) or GitLab CI (`script:`) file."""
    out = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "run" and isinstance(value, str):
                out += value.splitlines()
            elif key == "script":
                out += [line for item in value for line in str(item).splitlines()]
            else:
                out += _scripts(value)
    elif isinstance(node, list):
        for item in node:
            out += _scripts(item)
    return out


def _trtspec_calls(line: str) -> list[list[str]]:
    calls = []
    for part in line.replace(";", " ; ").split(" ; "):
        words = shlex.split(part.strip().removeprefix("do ").strip()) if part.strip() else []
        if words and Path(words[0]).name == "trtspec":
            calls.append(words[1:])
    return calls


def _command(args: list[str]) -> tuple[click.Command, list[str]]:
    command, rest = cli, list(args)
    while isinstance(command, click.Group) and rest and rest[0] in command.commands:
        command, rest = command.commands[rest[0]], rest[1:]
    return command, rest


def test_there_are_example_ci_files():
    assert {p.name for p in CI_FILES} == {"github-actions.yml", "gitlab-ci.yml"}


@pytest.mark.parametrize("path", CI_FILES, ids=[p.name for p in CI_FILES])
def test_every_trtspec_call_exists_with_its_options(path):
    data = yaml.safe_load(path.read_text())
    calls = [c for line in _scripts(data) for c in _trtspec_calls(line)]
    assert len(calls) >= 3
    for args in calls:
        command, rest = _command(args)
        assert not isinstance(command, click.Group), f"{path.name}: `trtspec {' '.join(args)}` names no command"
        options = {o for p in command.params for o in getattr(p, "opts", [])}
        for word in rest:
            if word.startswith("--"):
                assert word.split("=")[0] in options, f"{path.name}: `trtspec {' '.join(args)}`: no option {word}"
        for word in rest:
            if word.startswith("recipes/") and "*" not in word:
                load_recipe(ROOT / word)


@pytest.mark.parametrize("path", CI_FILES, ids=[p.name for p in CI_FILES])
def test_gpu_jobs_run_in_their_recipes_container(path):
    text = path.read_text()
    data = yaml.safe_load(text)
    jobs = data.get("jobs", data)
    found = 0
    for job in jobs.values():
        if not isinstance(job, dict):
            continue
        image = job.get("image") or (job.get("container") or {}).get("image")
        if not image or "trtllm" not in str(image):
            continue
        recipes = {w for line in _scripts(job) for c in _trtspec_calls(line) for w in c if w.startswith("recipes/")}
        for name in recipes:
            version = parse_version(load_recipe(ROOT / name).build.trtllm_version)
            assert image == version.container, (path.name, name)
            found += 1
    assert found >= 1
