"""The commands the README and docs/ show are ones the CLI and the benchmarks take: a renamed flag
or a moved recipe fails here, not in a reader's terminal."""
from __future__ import annotations

import argparse
import json
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest

from orchestrator.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = ("", "bash", "sh", "console")  # a usage synopsis goes in a ```text block
ROLECAST = re.compile(r"^(\S*/)?rolecast ")
BENCHMARK = re.compile(r"^(\S*/)?python3? (benchmarks/\w+\.py)")
PATHS = re.compile(r"^(recipes|roles|examples|benchmarks|plugins|sandboxes)/\S+$")


def shown_commands(page: Path) -> list[str]:
    """Each shell line of the page's code blocks (fenced, or indented four spaces) that runs
    ``rolecast`` or a benchmark, continuations joined, a trailing comment and whatever follows
    ``&&``, ``|`` or ``;`` cut; and each such command quoted whole in its prose, over a line break
    too (one that names a recipe, or a benchmark's flags, with no PLACEHOLDER: prose also mentions
    a bare ``rolecast eval --opponent``)."""
    text = page.read_text()
    blocks = [body for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M) if lang in SHELL]
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    blocks += re.findall(r"^ {4}(\S.*)$", prose, re.M)  # training.md's commands are indented blocks
    commands = [span for span in (" ".join(s.split()) for s in re.findall(r"`([^`]+)`", prose))
                if (ROLECAST.match(span) and " recipes/" in span or BENCHMARK.match(span) and " -" in span)
                and not re.search(r"\b[A-Z_]{2,}\b", span)]
    for line in "\n".join(blocks).replace("\\\n", " ").splitlines():
        line = re.split(r"\s+#", line.strip().removeprefix("$ "))[0]
        line = re.split(r"\s*(?:&&|\|\|?|;)\s*", line)[0]
        if ROLECAST.match(line) or BENCHMARK.match(line):
            commands.append(line)
    return commands


COMMANDS = [(page.relative_to(ROOT).as_posix(), line) for page in PAGES for line in shown_commands(page)]


class _Parsed(Exception):
    """Raised by a benchmark's parse_args once its flags are read: the benchmark itself never runs."""


def parses(script: str, args: list[str], monkeypatch) -> None:
    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, *a, **kw):
        parse(self, *a, **kw)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.setattr(sys, "argv", [script, *args])
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    with pytest.raises(_Parsed):
        runpy.run_path(str(ROOT / script), run_name="__main__")


def test_the_pages_show_commands():
    pages = {page for page, _ in COMMANDS}
    assert len(COMMANDS) >= 40 and pages >= {"README.md", "docs/gpu.md", "docs/scale.md", "docs/training.md"}
    assert sum(bool(BENCHMARK.match(line)) for _, line in COMMANDS) >= 10


@pytest.mark.parametrize("page,line", COMMANDS, ids=[f"{page}:{line[:60]}" for page, line in COMMANDS])
def test_a_shown_command_parses_and_names_files_that_exist(page, line, monkeypatch):
    args = shlex.split(line)
    for path in (arg.split("=", 1)[-1] for arg in args):  # recipes, roles and scripts it names are here
        if PATHS.match(path) and "*" not in path:
            assert (ROOT / path).exists(), f"{page}: {line!r} names {path}, which is not in the repository"
    try:
        if ROLECAST.match(line):
            build_parser().parse_args(args[1:])
        else:
            parses(args[1], args[2:], monkeypatch)
    except SystemExit as exit:
        pytest.fail(f"{page}: {line!r} is not a command it takes (exit {exit.code})")


def test_the_engine_and_trainer_keywords_the_pages_name_exist():
    """``HFEngine(share_prefixes=False)`` on a page is a keyword the constructor takes: a renamed one
    fails here, not as a reader's TypeError."""
    import inspect

    from orchestrator.engines.hf import HFEngine
    from orchestrator.training.client import ServiceClient

    classes = {"HFEngine": HFEngine, "ServiceClient": ServiceClient}
    named = [(page.relative_to(ROOT).as_posix(), name, keyword) for page in PAGES
             for name, args in re.findall(r"`(HFEngine|ServiceClient)\(([^`]*)\)`", page.read_text())
             for keyword in re.findall(r"(\w+)=", args)]
    assert len(named) >= 6
    for page, name, keyword in named:
        assert keyword in inspect.signature(classes[name]).parameters, f"{page}: {name} takes no {keyword}="


def test_the_device_stages_and_settings_the_pages_name_are_check_sh_s():
    """``check.sh learn`` and ``LEARN_SEEDS=...`` on a page are a stage and a setting that
    benchmarks/device/check.sh takes: a renamed one would be a reader's lost device call."""
    script = (ROOT / "benchmarks" / "device" / "check.sh").read_text()
    stages = set(re.findall(r"^ +(\w+)\)", script, re.M))
    for page in PAGES:
        text = page.read_text()
        for stage in re.findall(r"check\.sh (\w+)", text):
            assert stage in stages, f"{page.name}: check.sh has no stage {stage} (it has {', '.join(sorted(stages))})"
        for setting in re.findall(r"\b((?:LEARN|GRPO|SCALE)_[A-Z_]+)\b", text):
            assert re.search(r"\$\{%s\b" % setting, script), f"{page.name}: check.sh reads no {setting}"
    assert {"tests", "rollout", "learn", "scale"} <= stages


def test_writing_your_own_environment_names_every_hook_of_env():
    """Each part of ``Env`` a plugin's env may override is named where the page teaches writing one:
    ``task_from_cli`` was not, so ``--task 3`` on a plugin's env whose Task reads ``target`` said only
    "target: required key is missing" (the default task is ``{"text": VALUE}``), and ``close`` was not."""
    from orchestrator.envs.base import Env

    section = (ROOT / "docs/environments.md").read_text().split("## Writing your own environment")[1]
    # task_problem is what a Task model declares; recipients only addresses the Message that step() gets back
    hooks = sorted(set(n for n in vars(Env) if not n.startswith("_")) - {"task_problem", "recipients"})
    assert len(hooks) >= 12 and [n for n in hooks if not re.search(rf"\b{n}\b", section)] == []


def test_writing_your_own_environment_says_what_step_returns():
    """The page's one example, a single coin flip, ended its game with GameEnv.finish: a game of
    several turns had nothing to return for a turn that paid nothing, and the None it returned
    failed each episode. Every field of StepResult is named, and the empty one shown."""
    from dataclasses import fields

    from orchestrator.envs.base import StepResult

    section = (ROOT / "docs/environments.md").read_text().split("## Writing your own environment")[1]
    assert [f.name for f in fields(StepResult) if f"`{f.name}`" not in section] == []
    assert "`StepResult()`" in section and "`TwoPlayerConfig`" in section


def test_the_readme_names_every_hook_of_a_trainer():
    """README listed five of Trainer's hooks as "the other hooks": a plugin that kept its state in
    ``state_dict`` was not told that ``load_state_dict`` reads it back on --resume, nor of
    ``learners`` or ``step_advantages``."""
    from orchestrator.training.trainer import Trainer

    section = (ROOT / "README.md").read_text().split("### Plugins")[1].split("\n### ")[0]
    hooks = sorted(n for n in vars(Trainer) if not n.startswith("_"))
    assert len(hooks) >= 12 and [n for n in hooks if f"`{n}`" not in section] == []


def shown_teams() -> list[tuple[str, str]]:
    """Each ```yaml block of the pages that holds a whole team (its ``protocol`` and ``roles``)."""
    import yaml

    return [(page.relative_to(ROOT).as_posix(), body) for page in PAGES
            for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", page.read_text(), re.S | re.M)
            if lang == "yaml" and isinstance(doc := yaml.safe_load(body), dict) and {"protocol", "roles"} <= doc.keys()]


TEAMS = shown_teams()


@pytest.mark.parametrize("page,body", TEAMS, ids=[f"{page}:{i}" for i, (page, _) in enumerate(TEAMS)])
def test_a_shown_team_loads_as_written(page, body, tmp_path):
    """A team a page shows whole is one a reader can save and run: environments.md's PettingZoo
    teams had no ``name``, so each failed to load with "name: required key is missing"."""
    from orchestrator.team import load_team

    if "pettingzoo" in body:
        pytest.importorskip("pettingzoo")
    (tmp_path / "team.yaml").write_text(body)
    load_team(tmp_path / "team.yaml")


def table_options(cell: str) -> dict[str, str]:
    """Option -> the text in brackets after it, for each option a Plugin options cell names: the
    backticked name that opens each of its items (split at ``;`` and ``,`` outside brackets)."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(cell + ";"):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch in ";," and depth == 0:
            items.append(cell[start:i].strip())
            start = i + 1
    options = {}
    for item in items:
        if found := re.match(r"(?:also )?`(\w+)`(?: \(([^)]*))?", item):
            options[found[1]] = found[2] or ""
    return options


def test_the_plugin_options_table_names_each_option_and_its_default():
    """docs/training.md's "Plugin options" table is where a recipe's writer finds each built-in
    trainer's, reward's and loss's options: each row names every option of its Config and no
    other, and a default written as one value (``(5)``, ``(false)``, ``("judge")``, a backticked word)
    is the Config's, so a renamed option or a changed default fails here."""
    from orchestrator.config import LOSS_CONFIGS, SET_BY_TRAIN
    from orchestrator.registry import config_model, default_registry

    registry, loss = default_registry(), LOSS_CONFIGS["cross_entropy"]
    rows = re.findall(r"^\| (trainer|reward|loss)(?: (`[^|]*`)|, all three) \| (.*) \|$",
                      (ROOT / "docs/training.md").read_text(), re.M)
    checked = 0
    for kind, names, cell in rows:
        if kind == "loss":  # `loss, all three`: LossConfig less what training sets; `loss ppo`: what PPO adds
            model = LOSS_CONFIGS["ppo"] if names else loss
            models = {names or "all three": {n: f for n, f in model.model_fields.items()
                                             if not (f.json_schema_extra or {}).get(SET_BY_TRAIN)
                                             and (not names or n not in loss.model_fields)}}
        else:
            models = {n: config_model(registry.get(f"{kind}s", n)).model_fields for n in re.findall(r"`([^`]+)`", names)}
        options = {} if cell == "none" else table_options(cell)
        for name, fields in models.items():
            assert sorted(options) == sorted(fields), f"{kind} {name}: the table names {sorted(options)}, its Config has {sorted(fields)}"
            for option, said in options.items():
                value = re.split(r"[;,:]", said)[0].strip()
                try:
                    shown = value.strip("`") if re.fullmatch(r"`[\w-]+`", value) else json.loads(value)
                except ValueError:
                    continue  # prose: "every trainable role", "default `token-mean` in a recipe"
                assert shown == fields[option].default, f"{kind} {name}: {option}'s default is {fields[option].default!r}, not {value}"
                checked += 1
    assert len(rows) >= 10 and checked >= 25


def shown_blocks(key: str) -> list[tuple[str, dict]]:
    """Each ```yaml block of the pages that holds a ``key:`` block but no whole team."""
    import yaml

    return [(page.relative_to(ROOT).as_posix(), doc[key]) for page in PAGES
            for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", page.read_text(), re.S | re.M)
            if lang == "yaml" and isinstance(doc := yaml.safe_load(body), dict) and key in doc and "roles" not in doc]


def test_a_shown_training_block_takes_its_options():
    """A ``training:`` block a page shows (README's every key, populations.md's trainer_config) is
    one a recipe takes: its keys and values, and its trainer's options as that trainer's Config
    checks them."""
    from orchestrator.config import TrainingConfig
    from orchestrator.registry import config_model, default_registry

    blocks = shown_blocks("training")
    assert {page for page, _ in blocks} >= {"README.md", "docs/populations.md"}
    for page, block in blocks:
        training = TrainingConfig.model_validate(block)
        config_model(default_registry().get("trainers", training.trainer)).model_validate(training.trainer_config)


def test_issue_fixs_protocol_block_is_every_option_at_its_default():
    """docs/issue_fix.md shows the protocol's options with "defaults shown": each of them, and
    each at the default the env takes when a recipe leaves it out."""
    from orchestrator.issue_fix.env import IssueFixConfig

    [(_, block)] = [b for b in shown_blocks("protocol") if b[0] == "docs/issue_fix.md"]
    options = {k: v for k, v in block.items() if k != "type"}
    assert block["type"] == "issue_fix" and sorted(options) == sorted(IssueFixConfig.model_fields)
    assert IssueFixConfig.model_validate(options) == IssueFixConfig()
    assert sorted(options["sandbox"]) == sorted(IssueFixConfig.model_fields["sandbox"].annotation.model_fields)


def test_the_training_clients_table_names_its_calls_as_they_are():
    """docs/training.md's table of the training client is its API for a script of its own: each
    call is one TrainingClient or ServiceClient has, with the arguments it names, an ``_async``
    twin where the table promises one, and AdamParams and LoraConfig with their fields in full."""
    import dataclasses
    import inspect

    from orchestrator.training.client import ServiceClient, TrainingClient
    from orchestrator.training.types import AdamParams, LoraConfig

    section = (ROOT / "docs/training.md").read_text().split("## The training client")[1].split("\n## ")[0]
    calls = re.findall(r"^\| `(service\.)?(\w+)\(([^`]*)\)`", section, re.M)
    assert len(calls) >= 10
    options = {"AdamParams": AdamParams, "LoraConfig": LoraConfig}
    for service, name, args in calls:
        method = getattr(ServiceClient if service else TrainingClient, name, None)
        assert method is not None, f"the training client's table names {name}(), which its client lacks"
        if not service and name != "get_tokenizer":  # `*_async`: each of a client's calls that is a job
            assert hasattr(TrainingClient, f"{name}_async"), f"the table's `*_async` promises {name}_async"
        if nested := re.fullmatch(r"(?:\w+, )?(AdamParams|LoraConfig)\(([^)]*)\)", args):
            assert nested[2].split(", ") == [f.name for f in dataclasses.fields(options[nested[1]])], nested[1]
        elif "..." not in args and "[" not in args:
            assert (args.split(", ") if args else []) == list(inspect.signature(method).parameters)[1:], name


SET_COMMANDS = [(page, line) for page, line in COMMANDS if re.match(r"(\S*/)?rolecast train recipes/\S+ .*--set ", line)]


@pytest.mark.parametrize("page,line", SET_COMMANDS, ids=[f"{page}:{line[:60]}" for page, line in SET_COMMANDS])
def test_a_shown_set_is_one_its_recipe_takes(page, line):
    """``--set KEY=VALUE`` on a page's ``rolecast train`` is an option its recipe's training block
    takes, a plugin option as its plugin's Config checks it: parsing the command alone passes a
    misspelt key or a value out of range, which only the run itself refuses."""
    from orchestrator.api import load_team
    from orchestrator.cli.flags import parse_sets

    args = build_parser().parse_args(shlex.split(line)[1:])
    try:
        load_team(ROOT / args.recipe, parse_sets(args.sets))
    except Exception as exc:
        pytest.fail(f"{page}: {line!r}: {exc}")


def test_the_pages_show_sets():
    assert len(SET_COMMANDS) >= 12 and len(POPULATION_SETS) >= 4


POPULATION_SETS = [(page, line) for page, line in COMMANDS if re.match(r"python3? benchmarks/populations\.py .*--(population-)?set ", line)]


@pytest.mark.parametrize("page,line", POPULATION_SETS, ids=[f"{page}:{line[:60]}" for page, line in POPULATION_SETS])
def test_a_shown_population_benchmarks_sets_are_ones_its_recipes_take(page, line, monkeypatch):
    """The --set and --population-set options of a populations.py run a page shows, checked
    against the two recipes as the benchmark checks them before it trains."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import populations

    def trains(*_):
        raise _Parsed

    monkeypatch.setattr(populations, "train", trains)
    monkeypatch.setattr(sys, "argv", shlex.split(line)[1:])
    with pytest.raises(_Parsed):
        populations.main()


def test_the_teams_recipes_table_says_what_each_recipe_trains():
    """docs/teams.md's table of the team recipes: the roles it names are those each recipe trains,
    and its trainer and reward are the recipe's."""
    from orchestrator.team import load_team, trainable_roles

    rows = re.findall(r"^\| `(recipes/\S+\.yaml)` \| ([^|]+) \| ([^|]+) \| ([^|]+) \|$", (ROOT / "docs/teams.md").read_text(), re.M)
    assert len(rows) >= 7
    said = ""
    for recipe, roles, trainer, reward in rows:
        team = load_team(ROOT / recipe)
        said = said if reward.startswith("as above") else reward
        named = re.findall(r"`(\w+)`", re.sub(r"\(.*?\)", "", roles))  # "(the Judge's adapter)" says how, not who
        assert sorted(named) == sorted(trainable_roles(team.roles)), recipe
        assert re.match(r"`([\w-]+)`", trainer)[1] == team.config.training.trainer, recipe
        assert re.match(r"[\w-]+", said)[0] == team.config.training.reward, recipe
