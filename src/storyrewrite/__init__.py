"""storyrewrite: counterfactual story rewriting with differentiable training objectives."""
