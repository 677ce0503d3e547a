"""Schema-constrained decoding: a role's JSON schema as a token mask at every sampling step.

xgrammar compiles a schema once per (schema, tokenizer) into a grammar whose matcher says, for
the text so far, which tokens may come next (a packed bitmask, one bit per vocabulary entry).
The engine keeps one matcher per constrained request, fills the masks of a batch in one call
and applies them with one tensor op; unconstrained rows of the same batch are left alone.

JSON is tight: no free whitespace, ``", "`` and ``": "`` as separators (what ``json.dumps``
writes, and what the built-in roles' ``reply_prefix`` uses). A model under a mask that allows
whitespace tends to fill its budget with newlines; here every token carries content.

Length budgets (``ConstrainedRow.plan``): before each step the engine knows the shortest text
that closes the message from the current state (``GrammarBook.closing``); when sampling on
would leave too little room for it, the message is closed by force with that text and the end
of turn. Those forced tokens are not the policy's choice: completions count them
(``Completion.forced_tokens``), their logprob is 0, and training treats them as observations.
A message that cannot be closed within ``max_tokens`` at all samples on and ends with
``finish_reason == "length"`` (logged as ``engine.grammar_truncated``).

xgrammar is imported on first use: it takes a second or two to load.
"""
