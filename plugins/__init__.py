"""Built-in rolecast plugins, registered through rolecast's own entry points."""
