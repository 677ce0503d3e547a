"""rolecast: teams of LLM roles that learn together."""
