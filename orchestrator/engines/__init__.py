"""rolecast."""
