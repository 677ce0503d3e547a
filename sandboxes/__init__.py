"""Isolated execution of untrusted, model-written code."""
