"""A third-party plugin, installed with pip in the test, works without changing rolecast."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from abc import abstractmethod
from pathlib import Path

import pytest
from pydantic import BaseModel

from support import ERROR_LINE, plugin, write
from orchestrator.envs.guess_number import GuessNumberEnv
from orchestrator.registry import Registry, discover
from orchestrator.training.trainer import Trainer
from plugins.trainers.grpo import GRPO

PLUGIN = '''
import json
from pydantic import Field
from orchestrator.config import PluginConfig
from orchestrator.envs import Env, EnvConfig, StepResult
from orchestrator.hookspecs import hookimpl
from orchestrator.training.trainer import Trainer


class CoinConfig(EnvConfig):
    player: str
    flips: int = 3

    def role_refs(self):
        return [(("player",), self.player)]


class CoinEnv(Env):
    """Guess a seeded coin flip; +1 per right call."""
    Config = CoinConfig
    observation_keys = frozenset({"flip"})

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.flip = 0

    def next_role(self):
        return self.config.player if self.flip < self.config.flips else None

    def observe(self, role):
        return {"flip": self.flip}

    async def step(self, role, message):
        self.flip += 1
        side = self.rng.choice(["heads", "tails"])
        right = message.valid and message.content["call"] == side
        return StepResult(rewards={role: 1.0 if right else 0.0})


class AlwaysHeads:
    def __init__(self, spec):
        pass

    async def __call__(self, request):
        return '{"call": "heads"}'


class Scaled(Trainer):
    """Advantage = gain * reward: no baseline."""

    class Config(PluginConfig):
        gain: float = Field(1.0, gt=0, description="scales every reward")

    def advantages(self, rewards):
        return [[{r: self.config.gain * v for r, v in ep.items()} for ep in group] for group in rewards]


class StreakConfig(PluginConfig):
    bonus: float = Field(0.5, description="added to every role's reward")


def streak_reward(episode, roles, config):
    return {r: episode.rewards.get(r, 0.0) + config.bonus for r in roles}


streak_reward.Config = StreakConfig


def plain_reward(episode, roles, config):  # no Config: takes no options
    return {r: 0.0 for r in roles}


@hookimpl
def register_envs(register):
    register("coin", CoinEnv)


@hookimpl
def register_trainers(register):
    register("scaled", Scaled)


@hookimpl
def register_rewards(register):
    register("streak", streak_reward)
    register("plain", plain_reward)


@hookimpl
def register_policies(register):
    register("always-heads", AlwaysHeads)


def flip(args):
    print(f"flipped {args.times} coins")
    return 3 if args.times > 9 else 0


@hookimpl
def register_commands(subparsers):
    p = subparsers.add_parser("coin-flip", help="flip coins from the command line")
    p.add_argument("--times", type=int, default=1)
    p.set_defaults(func=flip)
'''

PYPROJECT = '''
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "rolecast-coin"
version = "0.3.0"

[project.entry-points."rolecast.plugins"]
coin = "rolecast_coin"
broken = "rolecast_coin_broken"
aaa = "rolecast_coin_takeover"

[tool.setuptools]
py-modules = ["rolecast_coin", "rolecast_coin_broken", "rolecast_coin_takeover"]
'''


TAKEOVER = """
from orchestrator.hookspecs import hookimpl


@hookimpl
def register_policies(register):
    register("random", object)
"""


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    write(src / "pyproject.toml", PYPROJECT)
    write(src / "rolecast_coin.py", PLUGIN)
    write(src / "rolecast_coin_broken.py", "raise ImportError('needs libfoo 2.0')\n")
    # named to load before the built-in `games` alphabetically: it must still not take `random`
    write(src / "rolecast_coin_takeover.py", TAKEOVER)
    site = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(site), str(src)],
        check=True, capture_output=True, text=True,
    )
    return site


def rolecast(site: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_plugins_lists_third_party_and_broken_plugin(plugin_site):
    proc = rolecast(plugin_site, "plugins", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    registered = {(r["plugin"], r["kind"], r["name"]) for r in data["registered"]}
    assert {("core", "env", "debate"), ("core", "env", "pipeline"), ("coin", "env", "coin"),
            ("coin", "policy", "always-heads"), ("coin", "trainer", "scaled"), ("coin", "reward", "streak"),
            ("coin", "command", "coin-flip")} <= registered  # a command too: a plugin of commands alone was not listed
    envs = [r["name"] for r in data["registered"] if r["kind"] == "env"]
    assert envs == sorted(envs)  # each kind by name, not in the order the plugins loaded
    coin_source = next(r["source"] for r in data["registered"] if r["plugin"] == "coin")
    assert coin_source == "rolecast-coin==0.3.0 (rolecast_coin)"
    failed = {f["plugin"]: f for f in data["failed"]}
    assert failed["broken"] == {"plugin": "broken", "source": "rolecast-coin==0.3.0 (rolecast_coin_broken)",
                                "error": "ImportError: needs libfoo 2.0"}
    # built-ins register first whatever the names: the newcomer that takes one of theirs is what fails
    assert ("games", "policy", "random") in registered and sorted(failed) == ["aaa", "broken"]
    assert failed["aaa"]["error"] == "register_policies: ValueError: policy 'random' is already registered by plugin 'games'"
    table = rolecast(plugin_site, "plugins")
    assert table.returncode == 0 and "needs libfoo 2.0" in table.stdout and "always-heads" in table.stdout and "coin-flip" in table.stdout


def test_plugins_table_into_a_closed_pipe_exits_141():
    """The tables of `plugins`, `run` and `eval` are rich's: its broken-pipe handler exited 1, which
    says the run failed, where `rolecast run ... | head -1` had done its work."""
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "plugins"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the command writes
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 128 + signal.SIGPIPE and err == "", err


def test_a_plugin_adds_a_command(plugin_site):
    proc = rolecast(plugin_site, "coin-flip", "--times", "3")
    assert proc.returncode == 0 and proc.stdout == "flipped 3 coins\n", proc.stderr
    assert rolecast(plugin_site, "coin-flip", "--times", "12").returncode == 3  # the handler's exit code
    assert "flip coins from the command line" in rolecast(plugin_site, "--help").stdout


def test_team_on_third_party_env_runs(plugin_site, tmp_path):
    write(tmp_path / "caller.md.j2", "Flip {{ flip }}: heads or tails?\n{{ schema }}\n")
    write(tmp_path / "caller.yaml", """
        name: caller
        description: Calls coin flips.
        prompt: caller.md.j2
        output_schema: {type: object, properties: {call: {enum: [heads, tails]}}, required: [call]}
        policy: {bind: "builtin:always-heads"}
        """)
    write(tmp_path / "team.yaml", """
        name: coins
        protocol: {type: coin, player: caller, flips: 4}
        roles: [{use: ./caller.yaml}]
        tasks: [{}]
        """)
    proc = rolecast(plugin_site, "run", "team.yaml", "--episodes", "5", "--json", "--no-progress", "--out", "out", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["status"] == {"ok": 5} and summary["roles"]["caller"]["turns"] == 20
    assert 0.0 < summary["roles"]["caller"]["mean_reward"] < 4.0  # seeded flips, not all heads
    assert rolecast(plugin_site, "validate", "team.yaml", cwd=tmp_path).returncode == 0


CALLER = """
    name: caller
    description: Calls coin flips.
    prompt: caller.md.j2
    output_schema: {type: object, properties: {call: {enum: [heads, tails]}}, required: [call]}
    policy: {adapter: caller}
    """
TRAINED_TEAM = """
    name: coins
    protocol: {type: coin, player: caller}
    roles: [{use: ./caller.yaml}]
    tasks: [{}]
    training:
      trainer: scaled
      trainer_config: {gain: 2.0}
      reward: streak
      reward_config: {bonus: 1.0}
    """


@pytest.mark.parametrize("old, new, line, key, words", [
    ("", "", None, None, None),
    ("gain: 2.0", "gian: 2.0", 7, "training.trainer_config.gian", "unknown key (allowed: gain)"),
    ("gain: 2.0", "gain: -1", 7, "training.trainer_config.gain", "greater than 0"),
    ("bonus: 1.0", "bonsu: 1.0", 9, "training.reward_config.bonsu", "unknown key (allowed: bonus)"),
    ("reward: streak", "reward: plain", 9, "training.reward_config.bonus", "unknown key"),
], ids=["valid", "trainer-typo", "trainer-range", "reward-typo", "reward-without-config"])
def test_third_party_trainer_and_reward_options_are_validated(plugin_site, tmp_path, old, new, line, key, words):
    write(tmp_path / "caller.md.j2", "Flip {{ flip }}: heads or tails?\n{{ schema }}\n")
    write(tmp_path / "caller.yaml", CALLER)
    write(tmp_path / "team.yaml", TRAINED_TEAM.replace(old, new))
    proc = rolecast(plugin_site, "validate", "team.yaml", cwd=tmp_path)
    if line is None:
        assert proc.returncode == 0, proc.stderr
        return
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    m = ERROR_LINE.match(proc.stderr.strip())
    assert m and m["file"] == "team.yaml" and int(m["line"]) == line and m["key"] == key, proc.stderr
    assert words in m["problem"], proc.stderr


def test_without_the_plugin_its_env_is_an_unknown_plugin(tmp_path, cli):
    write(tmp_path / "team.yaml", """
        name: coins
        protocol: {type: coin, player: judge}
        roles: [{use: judge}]
        tasks: [{}]
        """)
    code, _, err = cli("validate", tmp_path / "team.yaml")
    assert code == 2 and "protocol.type: unknown env plugin 'coin'" in err


def test_the_built_ins_are_registered_under_their_names():
    """A swapped or dropped line in plugins/core.py or plugins/games.py (`random` playing minimax,
    no `textarena`) passed the tests that load recipes."""
    from plugins.rewards import REWARDS

    registry = discover()
    got = {(r.plugin, kind, name): r.obj.__name__ for kind in ("envs", "policies", "trainers")
           for name, r in registry.items[kind].items() if r.plugin in ("core", "games")}  # not what else is installed
    assert got == {
        **{("core", "envs", name): cls for name, cls in (
            ("pipeline", "PipelineEnv"), ("debate", "DebateEnv"), ("issue_fix", "IssueFixEnv"), ("code_pair", "CodePairEnv"),
            ("propose_solve", "ProposeSolveEnv"), ("teacher_student", "TeacherStudentEnv"),
            ("generate_judge", "GenerateJudgeEnv"))},
        ("core", "policies", "stub"): "StubPolicy",
        **{("core", "trainers", name): cls for name, cls in (
            ("grpo", "GRPO"), ("freeze-rotate", "FreezeRotate"), ("m-grpo", "MGRPO"), ("self-play", "SelfPlay"),
            ("population", "Population"))},
        **{("games", "envs", name): cls for name, cls in (
            ("guess_number", "GuessNumberEnv"), ("twenty_questions", "TwentyQuestionsEnv"), ("tictactoe", "TicTacToeEnv"),
            ("prisoners_dilemma", "PrisonersDilemmaEnv"), ("rps", "RPSEnv"), ("textarena", "TextArenaEnv"),
            ("pettingzoo", "PettingZooEnv"))},
        **{("games", "policies", name): cls for name, cls in (
            ("random", "RandomPolicy"), ("minimax", "MinimaxPolicy"), ("binary-search", "BinarySearchPolicy"))},
    }
    assert {name: r.obj for name, r in registry.items["rewards"].items() if r.plugin == "core"} == REWARDS


def test_hook_that_raises_is_reported_and_others_still_register():
    def bad(register):
        raise RuntimeError("oops")

    registry = discover()
    registry.add_module(plugin(register_envs=bad), "bad", "test")
    registry.add_module(plugin(register_envs=lambda register: register("debate", GuessNumberEnv)), "clash", "test")
    errors = {f.plugin: f.error for f in registry.failures}
    assert errors["bad"] == "register_envs: RuntimeError: oops"
    assert "already registered by plugin 'core'" in errors["clash"]
    assert registry.get("envs", "debate").__name__ == "DebateEnv"


def test_a_plugin_that_fails_partway_keeps_none_of_its_names():
    def half(register):
        register("half-env", GuessNumberEnv)
        raise RuntimeError("second name failed")

    registry = discover()
    registry.add_module(plugin(register_envs=half, register_commands=lambda subparsers: None), "half", "test")
    assert [f.error for f in registry.failures if f.plugin == "half"] == ["register_envs: RuntimeError: second name failed"]
    assert "half-env" not in registry.names("envs")
    assert "half" not in [name for name, _ in registry.plugins] and "half" not in [c[0] for c in registry.commands]


def test_a_name_a_plugin_registers_twice_is_reported():
    """The second object silently replaced the first (two envs pasted under one name)."""
    registry = discover()
    registry.add_module(plugin(register_envs=lambda register: (register("coin", GuessNumberEnv),
                                                               register("coin", GuessNumberEnv))), "twice", "test")
    assert [f.error for f in registry.failures] == ["register_envs: ValueError: env 'coin' is registered twice"]
    assert "coin" not in registry.names("envs")


def test_a_misspelt_hook_or_a_taken_command_is_reported():
    import argparse

    registry = discover()
    # no such hook as register_env (it is register_envs)
    registry.add_module(plugin(register_env=lambda register: register("typo", object)), "misspelt", "test")
    registry.add_module(plugin(register_commands=lambda subparsers: subparsers.add_parser("run")), "takes-run", "test")
    sub = argparse.ArgumentParser().add_subparsers()
    sub.add_parser("run")
    registry.add_commands(sub)
    errors = {f.plugin: f.error for f in registry.failures}
    assert "register_env" in errors["misspelt"] and "typo" not in registry.names("envs")
    assert errors["takes-run"].startswith("register_commands: ") and "run" in errors["takes-run"]


def test_a_hook_without_the_hookimpl_marker_is_reported():
    """pluggy skips an unmarked function: the plugin loaded, registered nothing and listed no failure."""
    from types import SimpleNamespace

    unmarked = SimpleNamespace(register_envs=lambda register: register("coin", GuessNumberEnv))
    half = plugin(register_policies=lambda register: register("coin-policy", lambda spec: None))
    half.register_envs = unmarked.register_envs
    registry = discover()
    registry.add_module(unmarked, "coin", "test")
    registry.add_module(half, "half", "test")
    errors = [(f.plugin, f.error) for f in registry.failures]
    assert errors == [(name, "register_envs is not marked @hookimpl (from orchestrator.hookspecs import hookimpl)")
                      for name in ("coin", "half")]
    assert "coin" not in registry.names("envs") and "coin-policy" not in registry.names("policies")
    assert not {"coin", "half"} & {name for name, _ in registry.plugins}


def test_an_unmarked_commands_hook_is_reported():
    """Its command was missing from the CLI, and `rolecast plugins` listed the plugin as loaded."""
    from types import SimpleNamespace

    registry = Registry()
    registry.add_module(SimpleNamespace(register_commands=lambda subparsers: subparsers.add_parser("hello")), "cmd", "test")
    assert [f.error for f in registry.failures] == [
        "register_commands is not marked @hookimpl (from orchestrator.hookspecs import hookimpl)"]
    assert registry.plugins == [] and registry.commands == []


def test_a_plugin_whose_command_fails_keeps_none_of_its_names():
    import argparse

    registry = discover()
    registry.add_module(plugin(register_policies=lambda register: register("clashing-policy", lambda spec: None),
                               register_commands=lambda subparsers: subparsers.add_parser("run")), "clash", "test")
    assert "clashing-policy" in registry.names("policies")
    sub = argparse.ArgumentParser().add_subparsers()
    sub.add_parser("run")
    registry.add_commands(sub)
    assert "clashing-policy" not in registry.names("policies") and "clash" not in [p for p, _ in registry.plugins]


def test_the_plugin_after_one_whose_command_fails_still_adds_its_command():
    """Dropping the failed plugin shrank the list being iterated: the next plugin's command was skipped."""
    import argparse

    registry = Registry()
    registry.add_module(plugin(register_commands=lambda subparsers: subparsers.add_parser("run")), "a-clash", "test")
    registry.add_module(plugin(register_commands=lambda subparsers: subparsers.add_parser("hello")), "b-fine", "test")
    sub = argparse.ArgumentParser().add_subparsers()
    sub.add_parser("run")
    registry.add_commands(sub)
    assert "hello" in sub.choices and [f.plugin for f in registry.failures] == ["a-clash"]


def test_the_commands_a_plugin_adds_are_listed_once_per_parser():
    """`rolecast plugins` showed envs, policies, rewards and trainers: a plugin of commands alone was not there."""
    import argparse

    registry = Registry()
    registry.add_module(plugin(register_commands=lambda subparsers: subparsers.add_parser("run")), "a-clash", "test")
    registry.add_module(plugin(register_commands=lambda subparsers: subparsers.add_parser("hello")), "b-fine", "test")
    for _ in range(2):  # the parser built again adds the commands again
        sub = argparse.ArgumentParser().add_subparsers()
        sub.add_parser("run")
        registry.add_commands(sub)
    assert [(r.plugin, r.name) for r in registry.command_names] == [("b-fine", "hello")]


class _Abstract(Trainer):
    pass


class _LooseEnv(GuessNumberEnv):
    class Config(BaseModel):  # extra="ignore": a misspelt protocol key was dropped without a word
        player: str


class _AbstractEnv(GuessNumberEnv):
    @abstractmethod
    async def step(self, role, message): ...


class _SyncStepEnv(GuessNumberEnv):
    def step(self, role, message): ...


class _SyncCloseEnv(GuessNumberEnv):
    def close(self): ...


class _DictTaskEnv(GuessNumberEnv):
    Task = dict


def _loose_reward(episode, roles, config):
    return {}


_loose_reward.Config = _LooseEnv.Config


@pytest.mark.parametrize("kind, obj, words", [
    ("envs", 42, "42 is not an env (a subclass of orchestrator.envs.base.Env)"),
    ("policies", 42, "42 cannot be called"),
    ("rewards", "notafunction", "must be a function of (episode, roles, config)"),
    ("rewards", lambda episode, roles: {}, "must be a function of (episode, roles, config)"),
    ("trainers", _Abstract, "_Abstract does not implement advantages"),
    ("envs", _LooseEnv, "_LooseEnv.Config must be a pydantic model that forbids unknown keys (subclass orchestrator.envs.EnvConfig)"),
    ("envs", _AbstractEnv, "_AbstractEnv does not implement step"),
    # awaited by the episode: a plain def failed every episode with "can't be used in 'await' expression"
    ("envs", _SyncStepEnv, "_SyncStepEnv.step must be `async def`"),
    ("envs", _SyncCloseEnv, "_SyncCloseEnv.close must be `async def`"),
    # each task is validated against it at load: `rolecast validate` died with a traceback
    ("envs", _DictTaskEnv, "_DictTaskEnv.Task must be a pydantic model (subclass orchestrator.envs.base.TaskConfig)"),
    ("envs", GRPO, "GRPO is not an env"),  # a trainer has a Config too
    ("envs", object.__new__(GuessNumberEnv), "is not an env"),  # an instance, not the class
    ("rewards", max, "max must be a function of (episode, roles, config)"),  # no signature to read
    ("rewards", _loose_reward, "_loose_reward.Config must be a pydantic model that forbids unknown keys "
                               "(subclass orchestrator.config.PluginConfig)"),
])
def test_what_breaks_a_kinds_contract_is_refused_at_registration(kind, obj, words):
    """Else it passed, and failed later in a run with a traceback (an int has no Config)."""
    registry = discover()
    registry.add_module(plugin(**{f"register_{kind}": lambda register: register("broken", obj)}), "broken", "test")
    (failure,) = [f for f in registry.failures if f.plugin == "broken"]
    assert words in failure.error and "broken" not in registry.names(kind)


@pytest.mark.parametrize("name", ["", 42])
def test_a_name_that_is_not_a_non_empty_string_is_refused(name):
    """A number among the names made sorting them (the "known:" list of an unknown name) raise."""
    registry = discover()
    registry.add_module(plugin(register_policies=lambda register: register(name, lambda spec: None)), "odd", "test")
    assert [f.error for f in registry.failures] == [
        f"register_policies: ValueError: policy plugin name must be a non-empty string, got {name!r}"]
    assert "random" in registry.names("policies")


def test_a_plugin_registered_again_adds_its_command_once():
    """Its commands were kept twice: the second add_parser clashed, and the plugin was dropped."""
    import argparse

    registry = Registry()
    for _ in range(2):
        registry.add_module(plugin(register_commands=lambda subparsers: subparsers.add_parser("hello")), "hi", "test")
    registry.add_commands(argparse.ArgumentParser().add_subparsers())
    assert registry.failures == [] and [(r.plugin, r.name) for r in registry.command_names] == [("hi", "hello")]


def test_a_plugin_error_of_several_lines_is_reported_on_one():
    def bad(register):
        raise RuntimeError("needs libfoo\n  at /usr/lib/foo.so")

    registry = Registry()
    registry.add_module(plugin(register_envs=bad), "bad", "test")
    assert [f.error for f in registry.failures] == ["register_envs: RuntimeError: needs libfoo at /usr/lib/foo.so"]


def test_registering_again_forgets_the_names_it_no_longer_registers():
    registry = discover()
    registry.add_module(plugin(register_policies=lambda register: (register("coin-a", lambda spec: None),
                                                                   register("coin-b", lambda spec: None))), "coins", "test")
    registry.add_module(plugin(register_policies=lambda register: register("coin-b", lambda spec: None)), "coins", "test")
    assert "coin-a" not in registry.names("policies") and "coin-b" in registry.names("policies")


def test_a_plugin_whose_entry_point_name_is_taken_is_reported_not_skipped(monkeypatch):
    """A third-party entry point named ``games`` was dropped without a word, as if it were
    rolecast's own found twice on sys.path: its env never registered and `rolecast plugins`
    listed no failure."""
    import importlib.metadata
    from types import SimpleNamespace

    mine = plugin(register_envs=lambda register: register("my-coin", GuessNumberEnv))
    dist = SimpleNamespace(name="rolecast-mygames", version="1.0")
    theirs = [SimpleNamespace(name=name, value="my_games", load=lambda: mine, dist=dist) for name in ("games", "mine")]
    real = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group: [*real(group=group), *theirs, theirs[1]])  # `mine` as if found twice
    registry = discover()
    errors = [(f.plugin, f.source, f.error) for f in registry.failures]
    assert errors == [("games", "rolecast-mygames==1.0 (my_games)",
                       f"the plugin name 'games' is taken by rolecast=={importlib.metadata.version('rolecast')} "
                       "(plugins.games): rename its entry point")]
    assert ("mine", "rolecast-mygames==1.0 (my_games)") in registry.plugins and "my-coin" in registry.names("envs")


def test_an_entry_point_without_a_distribution_is_loaded_with_an_unknown_source(monkeypatch):
    """An entry point built by hand (no ``dist``) loads; its source says the distribution is unknown."""
    import importlib.metadata
    from types import SimpleNamespace

    mine = plugin(register_envs=lambda register: register("my-coin", GuessNumberEnv))
    loose = SimpleNamespace(name="mine", value="my_games", load=lambda: mine, dist=None)
    real = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [*real(group=group), loose])
    registry = discover()
    assert registry.failures == [] and ("mine", "? (my_games)") in registry.plugins


def test_an_entry_point_in_a_misspelt_group_is_reported(tmp_path, monkeypatch):
    """A plugin whose pyproject said ``rolecast.plugin`` was never loaded, and its env was only an
    "unknown env plugin", as if the package were not installed."""
    write(tmp_path / "haggle_plugin-0.1.0.dist-info" / "METADATA", "Metadata-Version: 2.1\nName: haggle-plugin\nVersion: 0.1.0\n")
    write(tmp_path / "haggle_plugin-0.1.0.dist-info" / "entry_points.txt",
          "[rolecast.plugin]\nhaggle = haggle_plugin\n\n[console_scripts]\nhaggle = haggle_plugin:main\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = discover()
    said = "its entry point is in group 'rolecast.plugin', which rolecast does not read: the group is 'rolecast.plugins'"
    assert [(f.plugin, f.source, f.error) for f in registry.failures] == [
        ("haggle", "haggle-plugin==0.1.0 (haggle_plugin)", said)]
    with pytest.raises(KeyError, match=f"plugin haggle failed to load: {said}"):
        registry.get("envs", "haggle")


def test_registry_get_unknown_names_known():
    with pytest.raises(KeyError, match="known: none"):
        Registry().get("trainers", "ppo")


def test_an_unknown_name_says_which_plugins_failed_to_load():
    """A trainer whose Config lets unknown keys through kept its plugin out; the recipe naming it
    read only "unknown trainer plugin", as if the package were not installed."""
    class Loose(Trainer):
        Config = object

        def advantages(self, rewards):
            return rewards

    registry = discover()
    registry.add_module(plugin(register_trainers=lambda register: register("loose", Loose)), "mine", "test")
    with pytest.raises(KeyError) as caught:
        registry.get("trainers", "loose")
    assert "unknown trainer plugin 'loose'" in str(caught.value)
    assert "; plugin mine failed to load: register_trainers: TypeError: " in str(caught.value)
    assert "Loose.Config must be a pydantic model" in str(caught.value)


def test_plugins_table_prints_brackets_as_written(monkeypatch, capsys):
    """rich read "[...]" in an error or a source as markup: a pip extra vanished from the hint,
    and a "[/path]" raised MarkupError instead of the listing."""
    import argparse

    from orchestrator.cli import plugins
    from orchestrator.registry import PluginFailure, Registration

    registry = Registry()
    registry.items["envs"]["coin"] = Registration("envs", "coin", object, "coin", "c==1 (coin [x])")
    registry.failures += [PluginFailure("gpu", "g==1 (gpu)", "ImportError: pip install 'g[cuda]'"),
                          PluginFailure("bad", "b==1 (bad)", "OSError: [/etc/b]")]
    monkeypatch.setattr(plugins, "default_registry", lambda: registry)
    assert plugins.handle(argparse.Namespace(json=False)) == 0
    out = capsys.readouterr().out
    assert "(coin [x])" in out and "pip install 'g[cuda]'" in out and "OSError: [/etc/b]" in out


def test_plugins_table_keeps_each_name_whole_in_a_narrow_terminal(monkeypatch, capsys):
    """At 40 columns rich cut every column: generate_judge read "generat…", and a name cut so
    could be another plugin's. The source folds instead."""
    import argparse

    from orchestrator.cli import plugins
    from orchestrator.registry import Registration

    registry = Registry()
    source = "rolecast==0.1.0 (plugins.core.environments)"
    registry.items["envs"]["generate_judge"] = Registration("envs", "generate_judge", object, "core", source)
    monkeypatch.setattr(plugins, "default_registry", lambda: registry)
    monkeypatch.setenv("COLUMNS", "40")
    assert plugins.handle(argparse.Namespace(json=False)) == 0
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in capsys.readouterr().out.splitlines()
            if line.startswith("│")]
    assert [row[:3] for row in rows if row[0]] == [["core", "env", "generate_judge"]], rows
    assert "".join(row[3] for row in rows) == source.replace(" ", "")


def test_a_policy_plugin_whose_factory_raises_is_one_line_naming_it():
    """`--policy coder=builtin:NAME` whose factory raised (a GPU it lacks, say) was a traceback."""
    from orchestrator.errors import RolecastError
    from orchestrator.policies.binding import Binding
    from orchestrator.rollout import build_policies
    from orchestrator.team import load_team
    from support import ROOT

    def needs_gpu(spec):
        raise RuntimeError("no GPU here")

    registry = discover()
    registry.add_module(plugin(register_policies=lambda register: register("needs-gpu", needs_gpu)), "mine", "test")
    team = load_team(ROOT / "recipes" / "guess_number.yaml", registry)
    with pytest.raises(RolecastError) as caught:
        build_policies(team, {"guesser": Binding("builtin", "needs-gpu")}, lambda: None, registry)
    assert str(caught.value) == "policy plugin 'needs-gpu' for role 'guesser' raised RuntimeError: no GPU here"
