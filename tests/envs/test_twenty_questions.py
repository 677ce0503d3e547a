"""Twenty Questions: the secret stays in the answerer's view, rewards, limits, the word split."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from play import Script, play, team
from orchestrator.envs.twenty_questions import same_word
from orchestrator.envs.words import WORDS, split_words


def ask(*questions: str, guess: str) -> Script:
    return Script(*({"action": "ask", "text": q} for q in questions), {"action": "guess", "text": guess})


def test_the_secret_never_reaches_the_guesser(tmp_path):
    guesser = ask("Is it alive?", "Is it bigger than a chair?", "Can you eat it?", guess="zzz")
    answerer = Script(*[{"answer": "no"}] * 3)
    result = play(team("twenty_questions"), {"guesser": guesser, "answerer": answerer}, tmp_path, episodes=30)
    assert len(result.episodes) == 30 and len(guesser.requests) == 30 * 4 and len(answerer.requests) == 30 * 3
    secrets = {e.outcome["secret"] for e in result.episodes}
    assert len(secrets) > 10
    by_episode = {e.id: e.outcome["secret"] for e in result.episodes}
    for request in guesser.requests:
        seen = json.dumps(request.context) + json.dumps(request.messages)
        assert not re.search(rf"\b{by_episode[request.episode]}", seen, re.IGNORECASE)
        assert "secret" not in request.context
    assert all(by_episode[r.episode] in r.messages[-1]["content"] for r in answerer.requests)
    assert [h["answer"] for h in guesser.requests[3].context["history"]] == ["no", "no", "no"]


def test_right_guess_pays_one(tmp_path):
    t = team("twenty_questions", tasks=[{"secret": "dog"}])
    (ep,) = play(t, {"guesser": ask("Is it an animal?", guess="Is it a Dog?"), "answerer": Script({"answer": "yes"})},
                 tmp_path).episodes
    assert ep.rewards == {"guesser": 1.0, "answerer": 0.0}
    assert ep.outcome["results"] == {"guesser": "win"} and ep.outcome["questions_asked"] == 1


@pytest.mark.parametrize("secret,guess", [("mouse", "mice"), ("butterfly", "Is it butterflies?"), ("knife", "knives"),
                                          ("leaf", "leaves"), ("snowman", "snowmen"), ("giraffe", "giraffes"),
                                          ("key", "keys"), ("bus", "buses")])
def test_a_guess_of_the_secrets_plural_is_right(secret, guess):
    """docs/environments.md: a guess is right when its last word is the secret or its plural; only
    -s and -es were taken, so "mice", "knives" or "butterflies" (secrets of the word list) lost."""
    assert secret in WORDS and same_word(guess, secret)
    assert not same_word(guess, "cat")


def test_wrong_guess_ends_the_game(tmp_path):
    t = team("twenty_questions", tasks=[{"secret": "dog"}], rewards={"correct": 1.0, "failed": -0.2})
    (ep,) = play(t, {"guesser": ask(guess="cat"), "answerer": Script()}, tmp_path).episodes
    assert len(ep.turns) == 1 and ep.rewards["guesser"] == -0.2 and ep.outcome["reason"] == "wrong_guess"


def test_asking_with_no_question_left_fails(tmp_path):
    t = team("twenty_questions", tasks=[{"secret": "dog"}], questions=2)
    guesser = ask("a?", "b?", "c?", guess="dog")
    (ep,) = play(t, {"guesser": guesser, "answerer": Script(*[{"answer": "no"}] * 2)}, tmp_path).episodes
    assert ep.rewards["guesser"] == 0.0 and ep.outcome["reason"] == "questions"
    assert guesser.requests[-1].context["questions_left"] == 0
    assert "You must guess now" in guesser.requests[-1].messages[-1]["content"]


def test_no_questions_leaves_one_guess(tmp_path):
    """questions: 0, the least allowed: a guess right away, or a question that ends the game."""
    t = team("twenty_questions", tasks=[{"secret": "dog"}], questions=0)
    (ep,) = play(t, {"guesser": ask("Is it big?", guess="dog"), "answerer": Script()}, tmp_path).episodes
    assert len(ep.turns) == 1 and ep.outcome["reason"] == "questions"
    (ep,) = play(t, {"guesser": ask(guess="a dog"), "answerer": Script()}, tmp_path).episodes
    assert ep.outcome["reason"] == "correct" and ep.rewards["guesser"] == 1.0


def test_invalid_turns_cost_the_penalty_and_a_question(tmp_path):
    # guesser: max_retries 1, invalid_penalty -1.0; answerer: an invalid answer counts as "unsure"
    guesser = Script("dog?", "dog?", {"action": "ask", "text": "Is it big?"}, {"action": "guess", "text": "dog"})
    answerer = Script("yes", "yes", "yes")  # max_retries 2: three bad attempts
    t = team("twenty_questions", tasks=[{"secret": "dog"}], on_invalid="continue")
    (ep,) = play(t, {"guesser": guesser, "answerer": answerer}, tmp_path).episodes
    assert ep.rewards == {"guesser": -1.0 + 1.0, "answerer": -1.0}
    last = guesser.requests[-1].context
    assert last["questions_left"] == 18 and last["history"] == [{"question": "Is it big?", "answer": "unsure"}]


def test_the_recipe_ends_the_game_on_an_invalid_guesser_turn(tmp_path):
    (ep,) = play(team("twenty_questions", tasks=[{"secret": "dog"}]), {"guesser": Script("dog", "dog"),
                                                                       "answerer": Script()}, tmp_path).episodes
    assert ep.rewards["guesser"] == -1.0 and ep.outcome["results"] == {"guesser": "loss"}
    assert ep.outcome["reason"] == "invalid"


def test_word_list_and_its_seeded_split():
    assert len(WORDS) >= 150 and len(set(WORDS)) == len(WORDS)
    train, test = split_words()
    assert not set(train) & set(test) and set(train) | set(test) == set(WORDS)
    assert split_words() == (train, test) and split_words(1) != (train, test)
    assert abs(len(test) - 0.2 * len(WORDS)) <= 1


def test_secrets_come_from_the_chosen_split(tmp_path):
    _, test = split_words()
    t = team("twenty_questions", split="test")
    result = play(t, {"guesser": ask(guess="x"), "answerer": Script()}, tmp_path, episodes=20)
    assert {e.outcome["secret"] for e in result.episodes} <= set(test)


@pytest.mark.parametrize("split, fraction", [("test", 0.001), ("train", 0.999)])
def test_a_split_with_no_words_is_refused_with_the_protocol(split, fraction):
    from orchestrator.envs.twenty_questions import TwentyQuestionsConfig

    with pytest.raises(ValidationError, match=f"leaves the {split} split empty"):
        TwentyQuestionsConfig(split=split, test_fraction=fraction)
    TwentyQuestionsConfig(split="train" if split == "test" else "test", test_fraction=fraction)  # the other is not


def test_the_answerer_is_another_role_than_the_guesser():
    """A guesser that was its own answerer saw the secret, and each of its messages, a right guess too,
    was taken as an answer: the game never ended before max_turns."""
    from orchestrator.envs.twenty_questions import TwentyQuestionsConfig

    with pytest.raises(ValidationError, match="the answerer 'guesser' must be another role than the guesser"):
        TwentyQuestionsConfig(players=["guesser"], answerer="guesser")


def test_an_illegal_penalty_is_refused_as_no_move_is_illegal():
    """Any question or guess is a legal move: an illegal_penalty loaded, and nothing ever paid it."""
    from orchestrator.envs.twenty_questions import TwentyQuestionsConfig

    with pytest.raises(ValidationError, match="illegal_penalty is not used here: any question or guess is a legal move"):
        TwentyQuestionsConfig(illegal_penalty=-5)
    TwentyQuestionsConfig.model_validate(TwentyQuestionsConfig().model_dump())  # config.yaml's whole copy: its default


def test_random_guesser_and_answerer_finish(tmp_path):
    result = play(team("twenty_questions"), {"guesser": "builtin:random", "answerer": "builtin:random"}, tmp_path,
                  episodes=20)
    assert len(result.episodes) == 20
    assert all(e.status == "ok" and e.outcome["results"] is not None for e in result.episodes)


def test_a_guesser_template_reading_the_secret_fails_at_load(tmp_path):
    """The secret is in the answerer's view only: a guesser prompt reading it passed `validate`,
    then every episode failed on its undefined variable."""
    from orchestrator.errors import ConfigError
    from orchestrator.team import load_team

    roles = Path(__file__).resolve().parents[2] / "roles"
    (tmp_path / "cheat.md.j2").write_text("The word is {{ secret }}.\n" + (roles / "prompts/guesser.md.j2").read_text())
    guesser = yaml.safe_load((roles / "guesser.yaml").read_text())
    (tmp_path / "guesser.yaml").write_text(yaml.safe_dump({**guesser, "prompt": "cheat.md.j2"}, sort_keys=False))
    recipe = (Path(__file__).resolve().parents[2] / "recipes/twenty_questions.yaml").read_text()
    (tmp_path / "team.yaml").write_text(recipe.replace("  - use: guesser", f"  - use: {tmp_path / 'guesser.yaml'}"))
    with pytest.raises(ConfigError, match=r"undefined variable\(s\) secret; available to role 'guesser'") as info:
        load_team(tmp_path / "team.yaml")
    assert info.value.file.endswith("cheat.md.j2") and "secret" not in str(info.value).rpartition("guesser' with")[2]
    assert "with protocol twenty_questions: " in str(info.value)  # the type the team file names, not the class
    # the answerer reads it, as the shipped prompt does
    load_team(Path(__file__).resolve().parents[2] / "recipes/twenty_questions.yaml")


def test_an_infinite_reward_is_refused_at_load(tmp_path):
    """A protocol's rewards are finite: `.inf` loaded, then every episode failed on its first payment."""
    from orchestrator.errors import ConfigError
    from orchestrator.team import load_team

    recipe = (Path(__file__).resolve().parents[2] / "recipes/twenty_questions.yaml").read_text()
    (tmp_path / "team.yaml").write_text(recipe.replace("rewards: {correct: 1.0,", "rewards: {correct: .inf,"))
    with pytest.raises(ConfigError, match="protocol.rewards.correct: .*finite") as info:
        load_team(tmp_path / "team.yaml")
    assert info.value.line == 11


def test_more_questions_than_max_turns_allows_are_refused_at_load(tmp_path):
    """questions: 40 takes up to 81 turns: under max_turns 64 a game of questions stopped at
    max_turns, with no guess and no result. guess_number's turns are checked the same way."""
    from orchestrator.errors import ConfigError
    from orchestrator.team import load_team

    root = Path(__file__).resolve().parents[2] / "recipes"
    (tmp_path / "tq.yaml").write_text((root / "twenty_questions.yaml").read_text().replace("questions: 20", "questions: 40"))
    with pytest.raises(ConfigError, match="tq.yaml:19: max_turns: a whole game can take 81 turns and max_turns is 64"):
        load_team(tmp_path / "tq.yaml")
    (tmp_path / "gn.yaml").write_text((root / "guess_number.yaml").read_text() + "max_turns: 4\n")
    with pytest.raises(ConfigError, match="a whole game can take 5 turns and max_turns is 4"):
        load_team(tmp_path / "gn.yaml")


def test_a_secret_is_taken_trimmed_and_in_lower_case(tmp_path):
    t = team("twenty_questions", tasks=[{"secret": " Dog "}])
    (ep,) = play(t, {"guesser": ask(guess="a dog"), "answerer": Script()}, tmp_path).episodes
    assert ep.outcome["secret"] == "dog" and ep.rewards["guesser"] == 1.0


def test_invalid_turns_fail_the_game_only_past_the_last_question(tmp_path):
    """An invalid turn uses up a question; the game fails at the one after the last, and the outcome
    counts the questions asked (not the turns lost) and keeps the guess."""
    t = team("twenty_questions", tasks=[{"secret": "dog"}], questions=1, on_invalid="continue")
    guesser = Script("x", "x", {"action": "guess", "text": "dog"})  # max_retries 1: one invalid turn, then a guess
    (ep,) = play(t, {"guesser": guesser, "answerer": Script()}, tmp_path).episodes
    assert ep.rewards["guesser"] == -1.0 + 1.0 and ep.outcome["reason"] == "correct"
    assert ep.outcome["questions_asked"] == 0 and ep.outcome["guess"] == "dog"
    (ep,) = play(t, {"guesser": Script("x", "x", "x", "x"), "answerer": Script()}, tmp_path).episodes
    assert ep.rewards["guesser"] == -2.0 and ep.outcome["reason"] == "questions" and ep.outcome["guess"] is None


def test_the_answerer_is_the_opponent_and_only_it_observes_the_question():
    from orchestrator.envs.twenty_questions import TwentyQuestionsEnv
    from orchestrator.evaluation import bind_opponent

    t = team("twenty_questions")
    assert bind_opponent(t, "base", {})[1] == "answerer"
    assert TwentyQuestionsEnv.observes(t.env_config, "guesser") == {"history", "questions", "questions_left"}
    assert TwentyQuestionsEnv.observes(t.env_config, "answerer") == TwentyQuestionsEnv.observation_keys


@pytest.mark.parametrize("edit, message", [
    (("enum: [ask, guess]", "enum: [ask]"), "waits for action 'guess' from role 'guesser'"),
    (("answer: {type", "reply: {type"), "reads field\\(s\\) answer of the messages of role 'answerer'"),
])
def test_roles_that_cannot_guess_or_answer_are_refused_at_load(tmp_path, edit, message):
    """A guesser whose schema cannot say "guess" asked until its questions ran out, every game; an
    answerer with no `answer` field answered "unsure" to every question."""
    from orchestrator.errors import ConfigError
    from orchestrator.team import load_team

    roles = Path(__file__).resolve().parents[2] / "roles"
    for name in ("guesser", "answerer"):
        (tmp_path / f"{name}.yaml").write_text((roles / f"{name}.yaml").read_text().replace(*edit).replace(
            "prompt: prompts/", f"prompt: {roles}/prompts/").replace("required: [answer]", "required: []"))
    recipe = (roles.parent / "recipes/twenty_questions.yaml").read_text()
    (tmp_path / "team.yaml").write_text(recipe.replace("  - use: guesser", f"  - use: {tmp_path / 'guesser.yaml'}")
                                        .replace("  - use: answerer", f"  - use: {tmp_path / 'answerer.yaml'}"))
    with pytest.raises(ConfigError, match=message):
        load_team(tmp_path / "team.yaml")
