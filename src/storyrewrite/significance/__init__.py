"""One-tailed paired bootstrap significance."""
from storyrewrite.significance.bootstrap import paired_bootstrap, paired_bootstrap_many

__all__ = ["paired_bootstrap", "paired_bootstrap_many"]
