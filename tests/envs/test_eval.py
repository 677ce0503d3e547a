"""`rolecast eval`: rates with Wilson intervals, the readable table, JSON, opponents."""
from __future__ import annotations

import json

import pytest

from orchestrator.evaluation import evaluate, wilson
from support import lora_state, make_episode, peft_dir
from play import ROOT, team


def test_wilson_interval_hand_computed():
    assert wilson(0, 10) == (0.0, 0.2775)
    assert wilson(5, 10) == (0.2366, 0.7634)
    assert wilson(10, 10) == (0.7225, 1.0)
    assert wilson(0, 0) is None
    assert json.dumps(wilson(0, 10)) == "[0.0, 0.2775]"  # the bound's float error cut at 0: not -0.0


def test_results_are_the_signs_of_finished_episodes_rewards_of_the_roles_that_learn():
    """Without a game's results a debater wins, draws or loses by its reward's sign; the frozen
    judge has no result, and an episode that failed (its rewards placeholders) or stopped at
    max_turns (no verdict: docs/environments.md) is no game; a mutant counting the latter passed."""
    t = team("debate")
    won, tied, failed, cut = (make_episode(rewards={"pro": r, "con": -r, "judge": 0.0}) for r in (1.0, 0.0, 1.0, 1.0))
    won.status = tied.status = "ok"
    failed.status, cut.status = "error", "max_turns"
    summary = {"roles": {r: {"mean_reward": 0.5, "reward_ci95": None} for r in t.roles}}
    report = evaluate(t, [won, tied, failed, cut], summary)
    assert set(report) == {"pro", "con"}
    assert [report["pro"][k] for k in ("games", "win", "draw", "loss")] == [2, 1, 1, 0]
    assert [report["con"][k] for k in ("games", "win", "draw", "loss")] == [2, 0, 1, 1]
    assert [report["con"][f"{k}_ci95"] for k in ("win", "draw", "loss")] == [wilson(0, 2), wilson(1, 2), wilson(1, 2)]
    assert evaluate(t, [won, tied, tied], summary)["pro"]["draw_rate"] == 0.6667


def test_a_role_that_sat_the_episode_out_has_no_result_in_it():
    """teacher_student's other-domain teacher holds a 0 in the rewards of an episode it sat out:
    counted, it drew every game of the other domain."""
    t = team("teacher_student")
    ep = make_episode(rewards={"teacher_largest": 1.0, "teacher_smallest": 0.0, "student": 1.0, "student_alone": 0.0})
    ep.status, ep.took_part = "ok", ["teacher_largest", "student", "student_alone"]
    summary = {"roles": {r: {"mean_reward": 0.5, "reward_ci95": None} for r in t.roles}}
    report = evaluate(t, [ep], summary)
    assert set(report) == {"teacher_largest", "student"} and report["teacher_largest"]["win"] == 1


def test_only_roles_bound_to_builtin_random_are_no_baseline_where_moves_are_unknown():
    """A mutant listing any binding that names "random" (a replay file of random moves) passed every test."""
    from types import SimpleNamespace

    from orchestrator.evaluation import blind_random_roles

    shown = {"p0": "builtin:random", "p1": "replay:random_moves.jsonl", "p2": "model (base)"}
    assert blind_random_roles(SimpleNamespace(env_config=SimpleNamespace(legal_moves_known=lambda: False)), shown) == ["p0"]
    assert blind_random_roles(SimpleNamespace(env_config=SimpleNamespace(legal_moves_known=lambda: True)), shown) == []


def test_reward_interval_is_students_t_hand_computed():
    """The mean reward's interval took the normal quantile, 1.96: a "95%" interval that held the
    mean 70% of the time at 2 episodes, 91% at 8."""
    from orchestrator.rollout import _ci95

    assert _ci95([1.0, 0.0]) == 6.3531  # t(1 df) 12.7062 x the standard error 0.5
    assert _ci95([0.0, 1.0, 1.0]) == 1.4342  # t(2 df) 4.3027 x 0.3333
    assert _ci95([0.0, 1.0] * 20) == 0.1619  # t(39 df) 2.0227 x 0.0801
    assert _ci95([1.0]) is None


def test_eval_prints_a_table(cli, tmp_path):
    code, out, err = cli("eval", ROOT / "recipes/tictactoe.yaml", "--episodes", "40", "--policy", "x=builtin:random",
                         "--opponent", "minimax", "--out", tmp_path / "ev", "--no-progress")
    assert code == 0, err
    assert "opponent o = minimax" in out and "W-D-L" in out and "95% CI" in out
    row = next(line for line in out.splitlines() if "builtin:minimax" in line)
    assert "-0 " in row.replace("│", " ")  # minimax lost none
    assert (tmp_path / "ev" / "eval.json").is_file()


def test_eval_table_prints_a_run_dir_with_brackets_as_it_is(cli, tmp_path):
    """rich read the run dir as markup: "exp[lr=1e-4]" was printed as "exp", and "[/x]" was a
    MarkupError traceback after every episode had been played."""
    out_dir = tmp_path / "exp[lr=1e-4][/x]"
    code, out, err = cli("eval", ROOT / "recipes/rps.yaml", "--episodes", "2", "--policy", "alice=builtin:random",
                         "--policy", "bob=builtin:random", "--out", out_dir, "--no-progress")
    assert code == 0, err
    assert f"run dir: {out_dir}" in out.replace("\n", ""), out  # rich folds a long line at 80 columns


def test_eval_table_prints_an_opponent_with_brackets_as_it_is(cli, tmp_path, capsys):
    """The title, which names a checkpoint:PATH opponent, was markup too: "[/x]" in its path raised
    MarkupError after every episode had been played."""
    from orchestrator.cli.eval import print_report

    code, out, err = cli("eval", ROOT / "recipes/rps.yaml", "--episodes", "2", "--policy", "alice=builtin:random",
                         "--policy", "bob=builtin:random", "--out", tmp_path / "ev", "--json")
    assert code == 0, err
    report = {**json.loads(out), "opponent": {"role": "bob", "policy": "checkpoint:runs/exp[/x]/sampler/bob"}}
    print_report(report)
    assert "opponent bob = checkpoint:runs/exp[/x]/sampler/bob" in " ".join(capsys.readouterr().out.split())
    print_report({**report, "env": {"acc[easy]": 0.5, "[/]": 1}})  # an env's metric names: "acc" alone, a MarkupError
    out = capsys.readouterr().out
    assert "acc[easy] 0.5, [/] 1" in out and "not a baseline" not in out
    print_report({**report, "illegal_baseline": ["alice", "bob"]})  # the table says it, as --json's field does
    assert "not a baseline: builtin:random (alice, bob) cannot see this game's legal moves" in \
        " ".join(capsys.readouterr().out.split())


def test_run_prints_an_envs_metric_names_as_they_are(cli, tmp_path, capsys):
    from orchestrator.cli.run import print_summary

    code, out, err = cli("run", ROOT / "recipes/rps.yaml", "--episodes", "2", "--policy", "alice=builtin:random",
                         "--policy", "bob=builtin:random", "--out", tmp_path / "run", "--json")
    assert code == 0, err
    print_summary({**json.loads(out), "env": {"acc[easy]": 0.5, "[/]": 1}})
    assert "acc[easy] 0.5, [/] 1" in capsys.readouterr().out


def test_run_table_keeps_figures_whole_in_a_narrow_terminal_and_says_its_statuses(cli, tmp_path, capsys, monkeypatch):
    """As eval's table: at 40 columns rich cut every column of run's ("-0.…" for a mean reward, "gu…"
    for guesser), and its title gave the statuses as a dict's repr ({'ok': 1}) after "1 episodes"."""
    from orchestrator.cli.run import print_summary

    code, out, err = cli("run", ROOT / "recipes/guess_number.yaml", "--episodes", "1", "--policy",
                         "guesser=builtin:binary-search", "--out", tmp_path / "run", "--json")
    assert code == 0, err
    summary = json.loads(out)
    summary["roles"]["guesser"].update(mean_reward=-0.125, reward_ci95=0.5)
    monkeypatch.setenv("COLUMNS", "40")
    print_summary(summary)
    table = capsys.readouterr().out
    assert "guess_number: 1 episode (ok 1)" in table, table
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in table.splitlines() if line.startswith("│")]
    g = summary["roles"]["guesser"]
    assert rows == [["guesser", "-0.125", "0.500", str(g["turns"]), str(g["invalid_turns"]), str(g["retries"])]], table
    g.update(mean_reward=None, reward_ci95=None)  # in no finished episode: no mean, not a TypeError after the run
    print_summary(summary)
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in capsys.readouterr().out.splitlines()
            if line.startswith("│")]
    assert [row[:3] for row in rows] == [["guesser", "-", ""]], rows


def test_eval_json_prints_only_the_report_on_stdout_with_the_progress_bar_on(cli, tmp_path):
    """As run --json: the bar draws on stderr. eval --json drew none, so a long evaluation into a
    file (``eval --json > r.json``) showed nothing on the terminal until it was done."""
    code, out, err = cli("eval", ROOT / "recipes/guess_number.yaml", "--episodes", "3", "--json",
                         "--policy", "guesser=builtin:binary-search", "--out", tmp_path / "ev")
    assert code == 0, err
    assert json.loads(out)["episodes"] == 3 and "3/3" in err


def test_eval_table_keeps_every_figure_at_80_columns(cli, tmp_path, capsys, monkeypatch):
    """Every column was no_wrap: past 80 columns (a pipe, a default terminal) rich cut them all, so
    guess_number with builtin:binary-search printed "win ra…" and "1.000 ±0.0…", a longer binding
    "0-…" for W-D-L and "0.000-0.…" for the interval. The names fold now; the figures stay whole."""
    from orchestrator.cli.eval import print_report

    code, out, err = cli("eval", ROOT / "recipes/guess_number.yaml", "--episodes", "5", "--json",
                         "--policy", "guesser=builtin:binary-search", "--out", tmp_path / "ev")
    assert code == 0, err
    report = json.loads(out)
    report["bindings"]["guesser"] = "python:mypkg.agents.guessing:binary_search_policy"
    monkeypatch.setenv("COLUMNS", "80")
    print_report(report)
    table = capsys.readouterr().out
    assert "win rate" in table and "5-0-0" in table and "0.566-1.000" in table and "1.000 ±0.000" in table, table
    assert "…" not in table and "python:mypkg.agents.guessing:binary_search_policy" in "".join(
        cell.strip() for line in table.splitlines() for cell in line.split("│")[2:3])
    assert "guess_number: 5 episodes (ok 5)" in table  # the statuses were a dict's repr: {'ok': 5}
    assert "no episode ended with a result" not in table
    for reward, ci95, cell in ((1.0, None, "1.000"), (None, None, "-")):  # one episode: no interval, not "±0.000"
        guesser = {**report["roles"]["guesser"], "mean_reward": reward, "reward_ci95": ci95}
        print_report({**report, "episodes": 1, "status": {"ok": 1}, "roles": {"guesser": guesser}})
        out = capsys.readouterr().out
        assert "guess_number: 1 episode (ok 1)" in out
        assert [line.split("│")[-2].strip() for line in out.splitlines() if line.startswith("│")][0] == cell, out
    # every episode stopped at max_turns: the table had no row, and nothing said why
    print_report({**report, "roles": {}, "status": {"max_turns": 5}})
    assert "no episode ended with a result (max_turns 5): W-D-L counts finished games only" in capsys.readouterr().out
    for columns in ("40", "60"):  # too narrow for the figures: rich cut them ("0.566-1.…") and dropped the names
        monkeypatch.setenv("COLUMNS", columns)
        print_report(report)
        out = capsys.readouterr().out
        assert f"run dir: {report['run_dir']}\n" in out  # whole on its line: rich broke the path at the width
        rows = [line.split("│") for line in out.splitlines() if line.startswith("│")]
        assert [cell.strip() for cell in rows[0][1:] if cell.strip()] == [
            "guesser", "python", "5-0-0", "1.000", "0.566-1.000", "1.000 ±0.000"], (columns, rows)
        assert "".join(row[2].strip() for row in rows) == "python:mypkg.agents.guessing:binary_search_policy"


def test_eval_json_success_rate(cli, tmp_path):
    code, out, err = cli("eval", ROOT / "recipes/guess_number.yaml", "--episodes", "25", "--json",
                         "--policy", "guesser=builtin:binary-search", "--out", tmp_path / "ev")
    assert code == 0, err
    report = json.loads(out)
    g = report["roles"]["guesser"]
    assert (g["games"], g["win"], g["win_rate"], g["win_ci95"]) == (25, 25, 1.0, list(wilson(25, 25)))
    assert report["opponent"] is None and report["bindings"] == {"guesser": "builtin:binary-search"}


def test_held_out_plays_the_recipes_eval_tasks(cli, tmp_path):
    code, out, err = cli("eval", ROOT / "recipes/guess_number.yaml", "--episodes", "8", "--json", "--held-out",
                         "--policy", "guesser=builtin:binary-search", "--out", tmp_path / "ev")
    assert code == 0, err
    secrets = {json.loads(line)["outcome"]["secret"] for line in (tmp_path / "ev" / "transcripts.jsonl").read_text().splitlines()}
    assert secrets == {3, 6, 11, 14}  # the recipe's training.eval_tasks, never its training secrets
    code, _, err = cli("eval", ROOT / "recipes/tictactoe.yaml", "--episodes", "2", "--held-out")
    assert code == 2 and "has no training.eval_tasks" in err


def test_eval_of_two_random_players_counts_every_game(cli, tmp_path):
    code, out, _ = cli("eval", ROOT / "recipes/rps.yaml", "--episodes", "30", "--json", "--opponent", "random",
                       "--policy", "alice=builtin:random", "--out", tmp_path / "ev")
    roles = json.loads(out)["roles"]
    assert roles["alice"]["win"] == roles["bob"]["loss"] and roles["alice"]["draw"] == roles["bob"]["draw"]
    assert sum(roles["alice"][k] for k in ("win", "draw", "loss")) == 30


def test_a_win_by_forfeit_counts_in_the_winners_mean_reward(tmp_path):
    """A player whose opponent forfeited before its first move won with a reward of 0, but it took no
    turn and the game paid it nothing, so it counted as sitting the episode out: RPS bob, 4-0-0 from two
    played wins (+3) and two forfeits (alice's invalid first move), had a mean reward of 3.0, not 1.5."""
    import rolecast

    def alice(request):
        return "no move" if request.episode_index % 2 else '{"move": "rock"}'

    evaluation = rolecast.evaluate(ROOT / "recipes/rps.yaml", episodes=4, out=tmp_path / "ev", progress=False,
                                   policies={"alice": alice, "bob": lambda request: '{"move": "paper"}'})
    bob = evaluation.report["roles"]["bob"]
    assert (bob["games"], bob["win"], bob["mean_reward"]) == (4, 4, 1.5)
    episodes = [json.loads(line) for line in (tmp_path / "ev" / "transcripts.jsonl").read_text().splitlines()]
    assert all(ep["took_part"] == ["alice", "bob"] for ep in episodes)


@pytest.mark.parametrize("recipe,opponent,message", [
    ("guess_number", "random", "declares no opponent role"),
    ("tictactoe", "nonsense", "unknown"),
    ("tictactoe", "checkpoint:/nowhere", "not a PEFT adapter dir"),
])
def test_eval_opponent_errors(cli, recipe, opponent, message):
    code, _, err = cli("eval", ROOT / f"recipes/{recipe}.yaml", "--opponent", opponent, "--policy", "x=builtin:random"
                       if recipe == "tictactoe" else "guesser=builtin:random")
    assert code == 2 and message in err


def test_an_opponent_that_a_policy_binds_too_is_refused(cli):
    """--policy o=... and --opponent minimax both bind o: one of them would be dropped unsaid."""
    code, _, err = cli("eval", ROOT / "recipes/tictactoe.yaml", "--opponent", "minimax", "--policy", "o=builtin:random")
    assert code == 2 and "--opponent and --policy both bind role 'o'" in err


def test_base_opponent_samples_without_an_adapter(tmp_path):
    from orchestrator.evaluation import bind_opponent
    from play import team

    t, role, checkpoint = bind_opponent(team("tictactoe"), "base", {})
    assert role == "o" and checkpoint is None
    assert t.roles["o"].config.policy.adapter is None and t.roles["x"].config.policy.adapter == "player"


def test_a_builtin_opponent_is_bound_by_its_name_with_or_without_the_prefix():
    from orchestrator.evaluation import bind_opponent
    from orchestrator.policies.binding import Binding

    for opponent in ("minimax", "builtin:minimax"):
        overrides = {}
        assert bind_opponent(team("tictactoe"), opponent, overrides)[1:] == ("o", None)
        assert overrides == {"o": Binding("builtin", "minimax")}


def test_checkpoint_opponent_samples_from_the_loaded_adapter(cli, tmp_path):
    """--opponent checkpoint:PATH loads a PEFT-format adapter into the engine for the opponent only."""
    from orchestrator.models import load_model

    folder = peft_dir(tmp_path / "ckpt", lora_state(load_model("tiny").model, 0, rank=2, std=0.0, modules=("q_proj",)))
    code, out, err = cli("eval", ROOT / "recipes/tictactoe.yaml", "--episodes", "2", "--model", "tiny", "--json",
                         "--policy", "x=builtin:random", "--opponent", f"checkpoint:{folder}", "--out", tmp_path / "ev")
    assert code == 0, err
    assert json.loads(out)["bindings"]["o"] == "model (eval-opponent)"
    turns = [json.loads(line)["turns"] for line in (tmp_path / "ev" / "transcripts.jsonl").read_text().splitlines()]
    assert {a["adapter"] for ts in turns for t in ts if t["role"] == "o" for a in t["attempts"]} == {"eval-opponent"}


def test_an_adapter_flag_for_the_checkpoint_opponent_is_refused(cli, tmp_path):
    """--adapter eval-opponent=DIR beside --opponent checkpoint:PATH: the checkpoint was loaded over
    DIR, and config.yaml recorded DIR as played."""
    from orchestrator.models import load_model

    folder = peft_dir(tmp_path / "ckpt", lora_state(load_model("tiny").model, 0, rank=2, std=0.0, modules=("q_proj",)))
    code, _, err = cli("eval", ROOT / "recipes/tictactoe.yaml", "--episodes", "2", "--model", "tiny", "--policy",
                       "x=builtin:random", "--opponent", f"checkpoint:{folder}", "--adapter", f"eval-opponent={folder}",
                       "--out", tmp_path / "ev")
    assert code == 2 and "--adapter eval-opponent: --opponent checkpoint:" in err and "Traceback" not in err, err
    assert not (tmp_path / "ev").exists()


@pytest.mark.parametrize("command", ["run", "eval"])
def test_adapter_flag_loads_trained_weights(cli, tmp_path, command):
    from orchestrator.models import load_model

    adapter = peft_dir(tmp_path / "player", lora_state(load_model("tiny").model, 0))
    extra = ["--opponent", "random"] if command == "eval" else []
    code, out, err = cli(command, ROOT / "recipes/tictactoe.yaml", "--model", "tiny", "--episodes", "2", *extra,
                         "--adapter", f"player={adapter}", "--out", tmp_path / "run", "--no-progress")
    assert code == 0, err
    episodes = [json.loads(line) for line in (tmp_path / "run" / "transcripts.jsonl").read_text().splitlines()]
    x = [a for e in episodes for t in e["turns"] if t["role"] == "x" for a in t["attempts"]]
    assert x and all(a["adapter"] == "player" and a["adapter_version"] == 1 for a in x)


@pytest.mark.parametrize("command", ["run", "eval"])
def test_bad_adapter_flag_is_one_line(cli, tmp_path, command):
    from orchestrator.models import load_model

    good = peft_dir(tmp_path / "player", lora_state(load_model("tiny").model, 0))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "adapter_config.json").write_text("{not json")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "adapter_config.json").write_text("{}")
    for flags, words in (
        ([f"player={tmp_path}"], "adapter_config.json"),
        ([f"player={tmp_path / 'broken'}"], "cannot read its adapter_config.json"),
        ([f"player={tmp_path / 'empty'}"], "no adapter_model.safetensors"),
        ([f"player={good}", f"player={good}"], "--adapter player: given twice"),
        ([f"plyer={good}"], "--adapter plyer: no role of tictactoe plays adapter 'plyer' (its roles' adapters: player)"),
    ):
        code, out, err = cli(command, ROOT / "recipes/tictactoe.yaml", "--model", "tiny", "--out", tmp_path / "run",
                             *[a for flag in flags for a in ("--adapter", flag)])
        assert code == 2 and words in err and "Traceback" not in err, err
        assert not (tmp_path / "run").exists()


def test_an_eval_where_every_episode_fails_exits_1_with_the_error(cli, tmp_path):
    code, _, err = cli("eval", ROOT / "recipes/guess_number.yaml", "--policy", "guesser=python:json:loads",
                       "--episodes", "2", "--no-progress", "--out", tmp_path / "ev")
    assert code == 1 and "every episode failed; the first: TypeError" in err
