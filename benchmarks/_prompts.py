"""Story topics the generation benchmarks share (rollout, grpo_vs_trl), so both prompt alike."""

TOPICS = ["a lighthouse keeper", "a chess tournament", "bread baking", "a lost dog", "the first day of school",
          "a mountain storm", "a broken robot", "a market at dawn", "an old map", "a jazz trio", "a river crossing",
          "a library at night", "a garden in winter", "a train delay", "a kite festival", "a code review"]
