"""The recipe layer: a YAML recipe parsed into dataclasses, every check that needs no model, and the run folder."""
