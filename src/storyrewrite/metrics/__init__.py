"""Evaluation metrics: the LM scorer (BARTScore), ROUGE-L, SacreBLEU and their counterfactual forms."""
from storyrewrite.metrics.lm_scorer import LMScorer

__all__ = ["LMScorer"]
