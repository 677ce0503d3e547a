"""The built-in role library: one YAML file per role, prompts in ``prompts/`` (package data).

Use a role in a team by its file name (``use: reviewer``); see ``orchestrator.role``.
"""
