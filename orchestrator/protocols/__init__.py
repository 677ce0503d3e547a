"""Team protocols: environments whose counterparts are all roles of the team."""
