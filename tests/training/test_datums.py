from __future__ import annotations

from orchestrator.training.datums import DatumBuildOptions, role_datums
from support import make_attempt as attempt
from support import make_episode as episode


def test_retry_that_extends_the_prompt_merges_into_one_sequence():
    first = attempt([1, 2, 3], [4, 5], [-0.1, -0.2], valid=False)
    retry = attempt([1, 2, 3, 4, 5, 9], [6, 7], [-0.3, -0.4])  # the retry prompt shows the reply, then 9
    other = attempt([50, 51], [52], [-0.5])
    ep = episode(("coder", [first, retry]), ("judge", [other]))
    (d,) = role_datums(ep, "coder", advantage=2.0)
    assert d.model_input.to_ints() == [1, 2, 3, 4, 5, 9, 6]
    li = d.loss_fn_inputs
    assert li["target_tokens"] == [2, 3, 4, 5, 9, 6, 7]
    assert li["mask"] == [0, 0, 1, 1, 0, 1, 1]
    assert li["logprobs"] == [0, 0, -0.1, -0.2, 0, -0.3, -0.4]
    assert li["advantages"] == [0, 0, -1.0, -1.0, 0, 2.0, 2.0]  # the invalid attempt: invalid_advantage
    unmerged = role_datums(ep, "coder", advantage=2.0, options=DatumBuildOptions(merge=False))
    assert [d.model_input.to_ints() for d in unmerged] == [[1, 2, 3, 4], [1, 2, 3, 4, 5, 9, 6]]


def test_a_prompt_that_is_exactly_the_sequence_so_far_continues_it():
    """A prompt that starts with the previous prompt and reply may be just them (a reply continued
    where it stopped): one sequence, the second reply's tokens right after the first's."""
    first, more = attempt([1, 2], [3, 4], [-0.1, -0.2]), attempt([1, 2, 3, 4], [5], [-0.3])
    (d,) = role_datums(episode(("p", [first]), ("p", [more])), "p", advantage=1.0)
    assert d.model_input.to_ints() == [1, 2, 3, 4] and d.loss_fn_inputs["mask"] == [0, 1, 1, 1]
    assert d.loss_fn_inputs["logprobs"] == [0, -0.1, -0.2, -0.3]


def test_unrelated_prompts_give_separate_sequences_and_drop_policy():
    ep = episode(("p", [attempt([1, 2], [3], [-1.0])]), ("p", [attempt([7, 8], [9], [-2.0], valid=False)]))
    assert len(role_datums(ep, "p", 1.0)) == 2
    # a longer prompt that does not start with the sequence so far is no continuation of it
    longer = episode(("p", [attempt([1, 2], [3], [-1.0])]), ("p", [attempt([1, 5, 3, 4], [9], [-2.0])]))
    assert [d.model_input.to_ints() for d in role_datums(longer, "p", 1.0)] == [[1, 2], [1, 5, 3, 4]]
    opts = DatumBuildOptions(invalid="drop")
    (d,) = role_datums(ep, "p", 1.0, opts)
    assert d.loss_fn_inputs["target_tokens"] == [2, 3] and opts.stats["dropped"] == 1


def test_attempts_without_tokens_are_counted_not_trained():
    # nothing sampled (a Python policy), or a reply of no tokens: a datum of its prompt alone trains
    # nothing, yet costs a pass and counts in sequence-mean's divisor
    ep = episode(("p", [attempt(None, None, None)]), ("p", [attempt([1, 2], [], [])]))
    opts = DatumBuildOptions()
    assert role_datums(ep, "p", 1.0, opts) == [] and opts.stats["no_tokens"] == 2


def test_attempts_sampled_by_an_adapter_older_than_the_bound_are_dropped():
    old, at_bound, new = attempt([1, 2], [3], [-1.0]), attempt([4, 5], [6], [-1.5]), attempt([7, 8], [9], [-2.0])
    old.adapter_version, at_bound.adapter_version, new.adapter_version = 3, 4, 5
    opts = DatumBuildOptions(min_version=4)
    kept = role_datums(episode(("p", [old]), ("p", [at_bound]), ("p", [new])), "p", 1.0, opts)
    assert [d.loss_fn_inputs["target_tokens"] for d in kept] == [[5, 6], [8, 9]] and opts.stats["stale"] == 1
    assert opts.versions == [4, 5]  # the versions of what trains: the loop's staleness metric averages their lags
