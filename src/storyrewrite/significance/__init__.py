"""One-tailed paired bootstrap significance, and bootstrap intervals."""
from storyrewrite.significance.bootstrap import paired_bootstrap, paired_bootstrap_many, percentile_interval, resample_means

__all__ = ["paired_bootstrap", "paired_bootstrap_many", "percentile_interval", "resample_means"]
