"""Coverage-guided fuzzing (atheris) of wire/'s parsers and of a live nsqd; see run.py."""
