"""`rolecast eval --population`: the round robin's schedule, payoff and score matrices, Bradley-Terry
ratings, 3-cycles, and the command end to end on a tiny population run."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import lora_state, peft_dir, tiny_engine, train_tiny, write

from orchestrator.population import Entrant, Game, analyse, bradley_terry, matrices, schedule, three_cycles

ROOT = Path(__file__).resolve().parents[2]


def test_schedule_plays_each_pair_equally_in_both_seats():
    entrants = [Entrant("a", adapter="a"), Entrant("b", adapter="b"), Entrant("random", builtin="random")]
    games = schedule(entrants, ["x", "o"], 4)
    assert len(games) == 3 * 4
    for first in ("a", "b", "random"):
        for second in ("a", "b", "random"):
            if first != second:
                assert sum(g["x"].name == first and g["o"].name == second for g in games) == 2


def test_an_odd_games_per_pair_gives_the_odd_first_seat_to_each_entrant_in_turn():
    """The earlier entrant of every pair had always sat first in the odd game: with 1 game a pair,
    the first entrant moved first in all its games and the last in none."""
    entrants = [Entrant(name, adapter=name) for name in "abc"]
    firsts = [g["x"].name for g in schedule(entrants, ["x", "o"], 1)]
    assert sorted(firsts) == ["a", "b", "c"]  # each entrant moves first in one of its two games


def rps_games() -> list[Game]:
    """rock beats scissors beats paper beats rock, each pair 3 games: 2 wins and a draw."""
    out = []
    for winner, loser in (("rock", "scissors"), ("scissors", "paper"), ("paper", "rock")):
        out += [Game(winner, loser, 1.0, -1.0), Game(loser, winner, -1.0, 1.0), Game(winner, loser, 0.0, 0.0)]
    return out


def test_zero_sum_payoff_is_antisymmetric_and_scores_complement():
    names = ["rock", "paper", "scissors"]
    m = matrices(names, rps_games())
    for a in names:
        assert m["payoff"][a][a] is None
        for b in names:
            if a != b:
                assert m["payoff"][a][b] == pytest.approx(-m["payoff"][b][a])
                assert m["score"][a][b] + m["score"][b][a] == pytest.approx(1.0)
                assert m["games"][a][b] == 3
    assert m["payoff"]["rock"]["scissors"] == pytest.approx(2 / 3, abs=1e-4)
    # a game that is not zero-sum: each side's payoff is its own reward, not the other's negated
    assert matrices(["a", "b"], [Game("a", "b", 1.0, 0.5)])["payoff"] == {"a": {"a": None, "b": 1.0}, "b": {"a": 0.5, "b": None}}
    assert m["score"]["rock"]["scissors"] == pytest.approx(5 / 6, abs=1e-4)


def test_three_cycles_and_ratings_of_a_cyclic_and_a_transitive_population():
    names = ["rock", "paper", "scissors"]
    cyclic = analyse([Entrant(n, adapter=n) for n in names], rps_games(), 3)
    assert cyclic["non_transitivity"] == {"three_cycles": [["rock", "scissors", "paper"]], "cyclic_triads": 1,
                                          "decided_triads": 1}
    elos = [cyclic["ratings"][n]["elo"] for n in names]
    assert elos == pytest.approx([1000.0] * 3, abs=0.5)  # a perfect cycle: nobody is stronger
    # a transitive order: strong beats mid beats weak, and strong beats weak
    games = [Game("strong", "mid", 1, -1)] * 4 + [Game("mid", "weak", 1, -1)] * 4 + [Game("strong", "weak", 1, -1)] * 4
    ranked = analyse([Entrant(n, adapter=n) for n in ("weak", "mid", "strong")], games, 4)
    r = {n: ranked["ratings"][n]["elo"] for n in ("weak", "mid", "strong")}
    assert r["strong"] > r["mid"] > r["weak"] and sum(r.values()) == pytest.approx(3000.0)
    assert ranked["non_transitivity"]["cyclic_triads"] == 0
    # a triad with a drawn pair is not decided: it could be no cycle whatever the draw hid
    drawn = {"a": {"a": None, "b": 0.5, "c": 1.0}, "b": {"a": 0.5, "b": None, "c": 1.0}, "c": {"a": 0.0, "b": 0.0, "c": None}}
    assert three_cycles(["a", "b", "c"], drawn) == ([], 0)
    lo, hi = ranked["ratings"]["strong"]["ci95"]
    assert lo <= r["strong"] <= hi


def test_three_cycles_in_either_orientation_and_a_drawn_pair_breaks_one():
    score = matrices(["rock", "paper", "scissors"], rps_games())["score"]
    assert three_cycles(["rock", "scissors", "paper"], score) == ([["rock", "scissors", "paper"]], 1)  # a > b > c > a
    # a draws b, b beats c, c beats a: no cycle, and the triad is not decided whichever pair drew
    for drawn in (("a", "b"), ("a", "c")):
        s = {x: {y: None if x == y else 1.0 if (x, y) in (("a", "b"), ("b", "c"), ("c", "a")) else 0.0 for y in "abc"}
             for x in "abc"}
        s[drawn[0]][drawn[1]] = s[drawn[1]][drawn[0]] = 0.5
        assert three_cycles(["a", "b", "c"], s) == ([], 0), drawn


def test_bradley_terry_ratings_solve_the_likelihood_equations():
    """At the fit each entrant's expected points, prior included, equal its points: the MM
    iterations ran to convergence, not a few steps short of it."""
    import math

    games = ([Game("a", "b", 1, -1)] * 5 + [Game("b", "a", 1, -1)] + [Game("b", "c", 1, -1)] * 3
             + [Game("c", "b", 0, 0)] * 2 + [Game("a", "c", 1, -1)] * 2 + [Game("c", "a", 1, -1)] * 2)
    elo = bradley_terry(["a", "b", "c"], games)
    s = {n: 10 ** ((r - 1000) / 400) for n, r in elo.items()}
    met = {("a", "b"): 6, ("b", "c"): 5, ("a", "c"): 4}
    for n in "abc":
        points = sum(g.points_a for g in games if g.a == n) + sum(1 - g.points_a for g in games if g.b == n)
        pairs = [(pair, k) for pair, k in met.items() if n in pair]
        expected = sum((k + 1) * s[n] / (s[n] + s[next(x for x in pair if x != n)]) for pair, k in pairs)
        assert expected == pytest.approx(points + 0.5 * len(pairs), abs=1e-6)
    assert math.fsum(elo.values()) / 3 == pytest.approx(1000.0)


def test_rating_intervals_are_the_bootstrap_percentiles(monkeypatch):
    """ci95 is the 2.5-97.5 percentile band of fits to the games resampled with replacement."""
    from orchestrator import population

    fits, samples = iter(range(-1, 200)), []

    def fake_fit(names, games, iterations=500):
        samples.append(games)
        return {n: float(next(fits)) for n in names[:1]} | {n: 0.0 for n in names[1:]}

    games = [Game("a", "b", 1, -1), Game("b", "a", 1, -1), Game("a", "b", 0, 0)]
    monkeypatch.setattr(population, "bradley_terry", fake_fit)
    ratings = population.ratings_with_intervals(["a", "b"], games, resamples=200)
    assert ratings["a"] == {"elo": -1.0, "ci95": [4.0, 194.0]}  # the 5th and 195th of the 200 fits 0..199
    assert samples[0] == games and len(samples) == 201
    assert all(len(g) == 3 and set(g) <= set(games) for g in samples[1:]) and any(g != games for g in samples[1:])


def test_a_resample_without_an_entrants_games_puts_nothing_in_its_interval():
    """c played one game and lost it: a resample that missed it fitted c with no game, a rating
    of nothing (its start, moved by the others' mean) that stretched c's interval above its fit
    and, by moving the mean, a's below the fit of an entrant that won every game."""
    from orchestrator.population import ratings_with_intervals

    r = ratings_with_intervals(["a", "b", "c"], [Game("a", "b", 1, -1)] * 10 + [Game("a", "c", 1, -1)])
    assert r["c"]["ci95"][1] <= r["c"]["elo"] and r["a"]["ci95"][0] >= r["a"]["elo"]


def test_bradley_terry_matches_the_two_player_closed_form():
    # with the prior, a 3-1 record is 3.5 points of 5 games: p = 0.7, a gap of 400 log10(0.7/0.3)
    games = [Game("a", "b", 1, -1)] * 3 + [Game("b", "a", 1, -1)]
    r = bradley_terry(["a", "b"], games)
    assert r["a"] - r["b"] == pytest.approx(400 * __import__("math").log10(0.7 / 0.3), abs=0.01)
    assert three_cycles(["a", "b"], matrices(["a", "b"], games)["score"]) == ([], 0)


def test_an_entrant_with_no_finished_game_is_not_rated(capsys, tmp_path):
    """A baseline that cannot play the game (minimax at Rock-Paper-Scissors: every game an error)
    kept its start: rated about 1000 with a narrow interval, ranked among the members, and the
    others' mean moved off 1000."""
    from orchestrator.cli.eval_population import print_report

    games = [Game("a", "b", 1, -1)] * 3 + [Game("b", "a", 1, -1)]
    entrants = [Entrant("a", adapter="a"), Entrant("b", adapter="b"), Entrant("minimax", builtin="minimax")]
    report = {"team": "t", "run_dir": str(tmp_path), **analyse(entrants, games, 4)}
    assert report["ratings"]["minimax"] == {"elo": None, "ci95": None}
    # the entrants as given, each with its kind: the builtin that played no game is still listed
    assert report["entrants"] == [{"name": "a", "kind": "adapter"}, {"name": "b", "kind": "adapter"},
                                  {"name": "minimax", "kind": "builtin"}]
    assert report["games_played"] == 4
    assert report["ratings"]["a"]["elo"] + report["ratings"]["b"]["elo"] == pytest.approx(2000.0, abs=0.2)
    print_report(report, tmp_path)
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("│")]
    assert [row.split()[1] for row in rows] == ["a", "b", "minimax"] and rows[-1].split()[3] == "-"
    # mean score: each row's own score against the others (a won 3 of 4), not theirs against it
    assert [row.split("│")[4].strip() for row in rows] == ["0.750", "0.250", "-"]


def test_the_payoff_heatmaps_row_is_the_entrant_whose_reward_it_shows(tmp_path, monkeypatch):
    """Row a, column b: a's mean reward against b, its colour and its figure both (a game that is
    not zero-sum tells a transposed matrix from the right one); the colours span the largest
    payoff either way, 0 in the middle."""
    from matplotlib.figure import Figure

    from orchestrator.training.report import payoff_heatmap

    report = {"team": "t", "games_per_pair": 2, "entrants": [{"name": "a"}, {"name": "b"}],
              "payoff": {"a": {"a": None, "b": 0.5}, "b": {"a": -0.25, "b": None}}}
    drawn = {}
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, **kw: drawn.update(
        cells=fig.axes[0].images[0].get_array().filled(0.0).tolist(), clim=fig.axes[0].images[0].get_clim(),
        texts={t.get_position(): t.get_text() for t in fig.axes[0].texts}))
    payoff_heatmap(report, tmp_path / "payoff.png")
    assert drawn == {"cells": [[0.0, 0.5], [-0.25, 0.0]], "clim": (-0.5, 0.5), "texts": {(1, 0): "0.50", (0, 1): "-0.25"}}


def test_the_population_table_counts_the_cyclic_triads_among_the_decided_ones(capsys, tmp_path):
    """a beats b beats c beats a, and d loses to each: one cyclic triad of four decided."""
    from orchestrator.cli.eval_population import print_report

    pairs = [("a", "b"), ("b", "c"), ("c", "a"), ("a", "d"), ("b", "d"), ("c", "d")]
    report = {"team": "t", "run_dir": str(tmp_path),
              **analyse([Entrant(n, adapter=n) for n in "abcd"], [Game(x, y, 1, -1) for x, y in pairs], 1)}
    print_report(report, tmp_path)
    out = capsys.readouterr().out
    assert "t: 6 games, 1 a pair" in out and "3-cycles in the win graph: 1 of 4 decided triads; written:" in out


def test_the_population_tables_title_counts_one_game_as_one(capsys, tmp_path):
    """A round robin of one finished game was "1 games" in the table's title."""
    from orchestrator.cli.eval_population import print_report

    report = {"team": "t", "run_dir": str(tmp_path), **analyse([Entrant(n, adapter=n) for n in "ab"], [Game("a", "b", 1, -1)], 1)}
    print_report(report, tmp_path)
    assert "t: 1 game, 1 a pair" in capsys.readouterr().out


def test_the_population_table_keeps_names_and_figures_whole_in_a_narrow_terminal(capsys, tmp_path, monkeypatch):
    """At 40 columns rich cut every column to fit: player-1@2 read "player-1…" (another entrant's
    name), an Elo of 1100 "11…", its interval "986-1…"."""
    from orchestrator.cli.eval_population import print_report

    names = ["player-1", "player-1@2", "player-1@12"]
    games = [Game(a, b, 1, -1) for a, b in (names[:2], names[1:], names[::2], names[1::-1])]
    report = {"team": "t", "run_dir": str(tmp_path), **analyse([Entrant(n, adapter=n) for n in names], games, 2)}
    monkeypatch.setenv("COLUMNS", "40")
    print_report(report, tmp_path)
    out = capsys.readouterr().out
    assert f"written: {tmp_path / 'population.json'}\n" in out  # whole on its line: rich broke the path at the width
    rows = [line.split("│")[1:-1] for line in out.splitlines() if line.startswith("│")]
    r = report["ratings"]
    assert [[cell.strip() for cell in row[:3]] for row in rows] == [
        [n, f"{r[n]['elo']:.0f}", f"{r[n]['ci95'][0]:.0f}-{r[n]['ci95'][1]:.0f}"]
        for n in sorted(names, key=lambda n: -r[n]["elo"])]


async def test_a_round_robin_where_no_game_finished_is_an_error(tmp_path):
    """Every game failed or was cut short: the report rated every entrant 1000, exit 0, and its
    population.json refused the rerun ("already holds a round robin")."""
    import dataclasses

    from orchestrator.errors import RunFailed
    from orchestrator.population import play_round_robin
    from orchestrator.team import load_team

    team = load_team(ROOT / "recipes/rps_population.yaml")
    team = dataclasses.replace(team, config=team.config.model_copy(update={"max_turns": 1}))  # 3 rounds need 6
    entrants = [Entrant("a", builtin="random"), Entrant("b", builtin="random")]
    with pytest.raises(RunFailed, match=r"no game of the round robin finished \({'max_turns': 2}\)"):
        await play_round_robin(team, ["alice", "bob"], entrants, None, 2, seed=0, out_dir=tmp_path, concurrency=2)


async def test_each_game_credits_each_entrant_with_its_own_seats_reward(tmp_path):
    """minimax never loses at Tic-Tac-Toe, in either seat: a game that swapped the seats' rewards
    would have it lose to random."""
    from orchestrator.population import play_round_robin
    from orchestrator.team import load_team

    team = load_team(ROOT / "recipes/tictactoe_population.yaml")
    seats = team.config.training.trainer_config["players"]
    entrants = [Entrant("minimax", builtin="minimax"), Entrant("random", builtin="random")]
    games = await play_round_robin(team, seats, entrants, None, 4, seed=0, out_dir=tmp_path, concurrency=2)
    assert len(games) == 4 and {g.a for g in games} == {"minimax", "random"}
    assert all(g.points_a == (0.0 if g.a == "random" else 1.0) or g.points_a == 0.5 for g in games)
    assert any(g.points_a != 0.5 for g in games)


def test_eval_population_end_to_end(cli, tmp_path):
    recipe = ROOT / "recipes/rps_population.yaml"  # members: 4; the run is trained with 3
    run = tmp_path / "run"
    train_tiny(cli, recipe, run, 2, "--set", "group_size=3", "--set", "trainer_config.members=3",
               "--set", "trainer_config.snapshot_every=1", "--set", "trainer_config.pool_size=1")
    assert sorted(p.name for p in (run / "pool").iterdir()) == ["player-0@1", "player-1@2"]  # the first left the pool
    # the model and dtype the run trained with are the defaults (no --model, --dtype); a baseline named twice plays once
    code, out, err = cli("eval", recipe, "--population", run, "--baseline", "random",
                         "--baseline", "random", "--games-per-pair", "2", "--json", "--no-progress")
    assert code == 0, err
    assert "as its config.yaml records them" in err and '"members": 3' in err
    report = json.loads(out.strip().splitlines()[-1])
    assert (report["model"], report["dtype"]) == ("tiny", "float32")
    names = [e["name"] for e in report["entrants"]]
    assert names == ["player-0", "player-1", "player-2", "player-1@2", "random"]  # the pool as it ended
    assert report["games_played"] == 10 * 2
    for a in names:  # rps pays +1/-1/0: zero-sum, so the payoff matrix is antisymmetric
        for b in names:
            if a != b:
                assert report["payoff"][a][b] == pytest.approx(-report["payoff"][b][a])
    assert json.loads((run / "population" / "population.json").read_text())["ratings"] == report["ratings"]
    code, _, err = cli("report", run, "--json")
    assert code == 0, err
    assert (run / "report" / "payoff.png").stat().st_size > 0
    assert (run / "report" / "elo.png").stat().st_size > 0  # the members' ratings over the steps
    # a round robin written elsewhere (eval --population --out DIR): report DIR draws its heatmap
    elsewhere = tmp_path / "round-robin"
    elsewhere.mkdir()
    (elsewhere / "population.json").write_text((run / "population" / "population.json").read_text())
    code, out, err = cli("report", elsewhere, "--json")
    assert code == 0 and json.loads(out)["plots"] == [str(elsewhere / "payoff.png")], err
    assert (elsewhere / "payoff.png").stat().st_size > 0
    before = (run / "population" / "population.json").read_text()
    code, _, err = cli("eval", recipe, "--population", run, "--model", "tiny", "--games-per-pair", "2")
    assert code == 2 and "already holds a round robin" in err and (run / "population" / "population.json").read_text() == before


def test_eval_population_refuses_a_recipe_that_trains_no_population(cli, tmp_path):
    code, _, err = cli("eval", ROOT / "recipes/rps.yaml", "--population", tmp_path, "--model", "tiny")
    assert code == 2 and "does not train a population" in err
    code, _, err = cli("eval", ROOT / "recipes/rps_population.yaml", "--population", tmp_path, "--model", "tiny")
    assert code == 2 and "lacks member(s) player-0" in err
    (tmp_path / "config.yaml").write_text("recipe: {name: debate, training: {trainer_config: {members: 2}}}\n")
    code, _, err = cli("eval", ROOT / "recipes/rps_population.yaml", "--population", tmp_path, "--model", "tiny")
    assert code == 2 and "is a run of recipe 'debate', not 'rps_population'" in err
    (tmp_path / "config.yaml").write_text("recipe: [unclosed\n")
    code, _, err = cli("eval", ROOT / "recipes/rps_population.yaml", "--population", tmp_path, "--model", "tiny")
    assert code == 2 and "config.yaml is unreadable" in err and "Traceback" not in err


def test_a_baseline_named_as_a_member_is_refused(cli, tmp_path):
    """Members [random, bob] beside the default baseline random: two entrants of one name, whose games,
    payoffs and rating the report merged into one."""
    for member in ("random", "bob"):
        peft_dir(tmp_path / "sampler" / member, lora_state(tiny_engine().model, 0))
    (tmp_path / "config.yaml").write_text("recipe: {name: rps_population, training: {trainer_config: "
                                          "{players: [alice, bob], members: [random, bob]}}}\n")
    code, _, err = cli("eval", ROOT / "recipes/rps_population.yaml", "--population", tmp_path, "--model", "tiny",
                       "--games-per-pair", "1", "--no-progress")
    assert code == 2 and "--baseline random: a member of" in err and "give another --baseline" in err, err
    assert not (tmp_path / "population").exists()


def test_eval_population_out_is_where_the_round_robin_goes(cli, tmp_path):
    """--out DIR holds population.json; the run's own population/ is left as it was. --dtype is
    what the games are played on, whatever the run recorded."""
    run = tmp_path / "run"
    for member in ("a", "b"):
        peft_dir(run / "sampler" / member, lora_state(tiny_engine().model, 0))
    (run / "config.yaml").write_text("recipe: {name: rps_population, training: {trainer_config: "
                                     "{players: [alice, bob], members: [a, b]}}}\nrun: {model: tiny, dtype: auto}\n")
    code, out, err = cli("eval", ROOT / "recipes/rps_population.yaml", "--population", run, "--dtype", "float32",
                         "--games-per-pair", "1", "--no-progress", "--out", tmp_path / "rr")
    assert code == 0, err
    assert f"written: {tmp_path / 'rr' / 'population.json'}" in out, out
    report = json.loads((tmp_path / "rr" / "population.json").read_text())
    assert (report["games_played"], report["model"], report["dtype"]) == (3, "tiny", "float32")
    assert not (run / "population").exists()
    # the run itself is no --out: its games went among its files, and `rolecast report RUN` drew no heatmap
    files = sorted(run.rglob("*"))
    code, _, err = cli("eval", ROOT / "recipes/rps_population.yaml", "--population", run, "--games-per-pair", "1",
                       "--no-progress", "--out", run)
    assert code == 2 and f"--out {run} already holds a run" in err and sorted(run.rglob("*")) == files, err


def test_eval_population_plays_with_its_flags_or_their_defaults(cli, tmp_path, monkeypatch):
    """What the round robin is played with: --games-per-pair's default, 20 as its help says; --seed 0
    as given, not the recipe's 7; --concurrency and --timeout as given, else the recipe's (None: the
    games take the team's episode_timeout_s); the run's model and dtype, but another --model's own
    dtype, not the run's."""
    import orchestrator.engines.load
    import orchestrator.population

    recipe = write(tmp_path / "rps_population.yaml", (ROOT / "recipes/rps_population.yaml").read_text() + "seed: 7\n")
    run = tmp_path / "run"
    for member in ("a", "b"):
        write(run / "sampler" / member / "adapter_config.json", "{}")
    write(run / "config.yaml", "recipe: {name: rps_population, training: {trainer_config: "
                               "{players: [alice, bob], members: [a, b]}}}\nrun: {model: tiny, dtype: float32}\n")
    played = []

    class Engine:
        async def aclose(self):
            pass

    async def play_round_robin(team, players, entrants, engine, games_per_pair, **options):
        played.append((games_per_pair, *(options[k] for k in ("seed", "concurrency", "timeout"))))
        return [Game("a", "b", 1.0, -1.0)]

    monkeypatch.setattr(orchestrator.engines.load, "load_engine", lambda model, dtype, *args, **kwargs:
                        played.append((model, dtype)) or Engine())
    monkeypatch.setattr(orchestrator.population, "play_round_robin", play_round_robin)
    for n, flags in enumerate(([], ["--games-per-pair", "3", "--seed", "0", "--concurrency", "2", "--timeout", "1.5",
                                    "--model", "smollm2-135m"])):
        code, _, err = cli("eval", recipe, "--population", run, "--no-progress", "--out", tmp_path / f"rr{n}", *flags)
        assert code == 0, err
    assert played == [("tiny", "float32"), (20, 7, 16, None), ("smollm2-135m", "auto"), (3, 0, 2, 1.5)]
    code, _, err = cli("eval", recipe, "--population", run, "--baseline", "nobody", "--out", tmp_path / "rr2")
    assert code == 2 and "--baseline nobody: unknown (builtin policies: " in err and played[4:] == [], err


def test_eval_population_flags_that_do_not_apply_are_refused(cli, tmp_path):
    recipe = ROOT / "recipes/rps_population.yaml"
    for args, words in (
        (["--population", tmp_path / "nowhere"], "no such folder"),
        (["--population", recipe], f"--population {recipe}: not a folder"),
        (["--population", tmp_path, "--held-out"], "drop --held-out"),
        (["--population", tmp_path, "--episodes", "5"], "drop --episodes"),
        (["--population", tmp_path, "--ray"], "--population plays its round robin in this process"),
        (["--population", tmp_path, "--rollout-workers", "2"], "--population plays its round robin in this process"),
        (["--population", tmp_path, "--opponent", "random", "--policy", "alice=builtin:random"],
         "--population plays its own entrants: drop --opponent, --policy"),
        (["--games-per-pair", "5"], "--games-per-pair: only with --population"),
        (["--baseline", "random"], "--baseline: only with --population"),
    ):
        code, _, err = cli("eval", recipe, "--model", "tiny", *args)
        assert code == 2 and words in err and "Traceback" not in err, (args, err)


def test_a_round_robin_with_no_finished_game_rates_nobody():
    # every entrant unrated left bradley_terry no one to fit: ZeroDivisionError
    from orchestrator.population import ratings_with_intervals

    assert ratings_with_intervals(["a", "b"], []) == {"a": {"elo": None, "ci95": None}, "b": {"elo": None, "ci95": None}}


def test_the_pool_is_the_snapshots_the_trainer_named(tmp_path):
    """Without a checkpoint every folder of pool/ was an entrant, sorted by the number after its
    "@": one made by hand, x@abc, was a ValueError traceback."""
    from orchestrator.cli.eval_population import snapshots

    for name in ("player-0@10", "player-1@2", "x@abc", "x@3", "player-0@x"):
        (tmp_path / "pool" / name).mkdir(parents=True)
        (tmp_path / "pool" / name / "adapter_config.json").write_text("{}")
    assert [p.name for p in snapshots(tmp_path, ["player-0", "player-1"])] == ["player-1@2", "player-0@10"]
    # with a checkpoint, those its pool holds: player-1@2 left the pool, its folder kept for an older checkpoint
    write(tmp_path / "checkpoints" / "step-000010" / "trainer.json",
          json.dumps({"step": 10, "trainer": {"pool": ["player-0@10"]}}))
    assert [p.name for p in snapshots(tmp_path, ["player-0", "player-1"])] == ["player-0@10"]
