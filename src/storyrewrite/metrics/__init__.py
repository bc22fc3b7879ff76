"""Evaluation metrics: the LM scorer (BARTScore, `lm_scorer`), ROUGE-L and SacreBLEU (`lexical`),
their counterfactual forms (`counterfactual`, torch-free: significance and the report use it),
and the scoring of one system (`evaluate`)."""
