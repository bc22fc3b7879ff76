"""The one place that loads generators, scorers and their tokenizers."""
