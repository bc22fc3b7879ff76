"""Does an ending follow the counterfactual event? Metrics that a copy of the original ending
cannot win by being close to the reference (the overlap metrics reward copying: Qin et al.
2019, Table 6, found BLEU and ROUGE correlate negatively with human judgements of following
the counterfactual).

With X_P the premise, X_IE the initial and X_CE the counterfactual event, X_OE the original
ending, Y_EE the reference rewrite, and Ŷ the ending scored:

  cf_pmi(Ŷ)  = M_J(Ŷ | X_P ⊕ X_CE) − M_J(Ŷ | X_P ⊕ X_IE)
               = (1/|Ŷ|)·[log p_J(Ŷ | X_P, X_CE) − log p_J(Ŷ | X_P, X_IE)]
  cf_follow  = the share of instances with cf_pmi > 0
  drift(Ŷ)   = cos(φ(X_P ⊕ X_CE ⊕ Ŷ) − φ(X_P ⊕ X_IE ⊕ X_OE), φ(X_P ⊕ X_CE ⊕ Y_EE) − φ(X_P ⊕ X_IE ⊕ X_OE))
  ents(Ŷ)    = P(entailment | premise = X_P ⊕ X_CE, hypothesis = Ŷ)
  hmean      = 2·B·E / (B + E),  B = corpus SacreBLEU / 100,  E = mean ents

- CF-PMI: a causal LM judge J (`models.judge`) and M as BARTScore counts it (the mean
  log-probability of Ŷ's tokens and its end token, storyrewrite.metrics.lm_scorer), so |Ŷ|
  counts the end token too and an empty ending has a value. Positive: Ŷ fits the counterfactual
  story better than the original one.
- Drift similarity (Qin et al. 2019, the data set's `evaluate.py`): does Ŷ move the story's
  embedding the way the reference rewrite does? φ is a sentence encoder (`models.embedder`,
  storyrewrite.models.sentence); the contexts include the premise, as in that script. One
  reference per instance, as for every column here (the script takes the best of a story's
  three).
- EntScore and HMean (Chen et al. 2022, EDUCAT): an NLI classifier (`models.nli`), its
  entailment class found by name.
"""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from storyrewrite.metrics.lm_scorer import LMScorer
from storyrewrite.models.roles import entailment_label
from storyrewrite.models.sentence import SentenceEncoder


def judge_contexts(instance: dict) -> tuple[str, str]:
    """(X_P ⊕ X_CE, X_P ⊕ X_IE): the counterfactual and the original story before its ending."""
    return f"{instance['premise']} {instance['counterfactual']}", f"{instance['premise']} {instance['initial']}"


def cf_pmi(judge: LMScorer, instances: list[dict], endings: list[str], batch_size: int = 16) -> list[float]:
    """cf_pmi of each ending (endings[i] for instances[i]). Both contexts of every instance are
    scored in one batched, length-sorted pass, each distinct (context, ending) pair once (a
    story's three instances share their contexts, and a system's endings for them often repeat)."""
    n = len(instances)
    counterfactual, initial = zip(*(judge_contexts(row) for row in instances), strict=True) if n else ((), ())
    values = judge.score([*counterfactual, *initial], [*endings, *endings], batch_size)
    return [after_cf - after_initial for after_cf, after_initial in zip(values[:n], values[n:], strict=True)]


def drift_similarity(encoder: SentenceEncoder, instances: list[dict], endings: list[str],
                     references: list[list[str]] | None = None) -> list[float]:
    """drift of each ending against its instance's reference; with `references` (one list per
    instance), the largest drift against any of them (Qin et al.'s multi-reference form).
    Every distinct text is embedded once."""
    references = references if references is not None else [[row["target"]] for row in instances]
    original = [f"{row['premise']} {row['initial']} {row['original_ending']}" for row in instances]
    scored = [f"{row['premise']} {row['counterfactual']} {ending}" for row, ending in zip(instances, endings, strict=True)]
    gold = [[f"{row['premise']} {row['counterfactual']} {ref}" for ref in refs] for row, refs in zip(instances, references, strict=True)]
    texts = list(dict.fromkeys([*original, *scored, *(text for texts in gold for text in texts)]))
    vectors = dict(zip(texts, encoder.embed(texts), strict=True))
    values = []
    for start, ending, refs in zip(original, scored, gold, strict=True):
        moved = vectors[ending] - vectors[start]
        targets = torch.stack([vectors[ref] - vectors[start] for ref in refs])
        values.append(float(torch.nn.functional.cosine_similarity(moved.unsqueeze(0), targets, dim=-1).max()))
    return values


class EntailmentScorer:
    """P(entailment | premise, hypothesis) from a sequence classifier; its entailment class is
    looked up by name in the config's id2label."""

    def __init__(self, model_dir: str | Path, spec: str, device: torch.device | str = "cpu", max_length: int = 512):
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForSequenceClassification.from_pretrained(model_dir).to(device).eval()
        self.label = entailment_label(self.model.config, spec)
        self.max_length = min(max_length, self.tokenizer.model_max_length)

    @torch.inference_mode()
    def probabilities(self, premises: list[str], hypotheses: list[str], batch_size: int = 16) -> list[float]:
        """P(entailment) of each (premise, hypothesis) pair, in input order; length-sorted
        batches, each distinct pair once."""
        pairs = list(zip(premises, hypotheses, strict=True))
        unique = list(dict.fromkeys(pairs))
        lengths = [len(ids) for ids in self.tokenizer([p for p, _ in unique], [h for _, h in unique])["input_ids"]]
        order = sorted(range(len(unique)), key=lambda i: -lengths[i])
        found: dict[tuple[str, str], float] = {}
        for start in range(0, len(order), batch_size):
            chunk = [unique[i] for i in order[start : start + batch_size]]
            inputs = self.tokenizer([p for p, _ in chunk], [h for _, h in chunk], padding=True, truncation=True,
                                    max_length=self.max_length, return_tensors="pt").to(self.model.device)
            probabilities = torch.softmax(self.model(**inputs).logits.float(), dim=-1)[:, self.label]
            found.update(zip(chunk, probabilities.tolist(), strict=True))
        return [found[pair] for pair in pairs]


def entailment(nli: EntailmentScorer, instances: list[dict], endings: list[str], batch_size: int = 16) -> list[float]:
    """ents of each ending: the counterfactual story X_P ⊕ X_CE entails it."""
    premises = [judge_contexts(row)[0] for row in instances]
    return nli.probabilities(premises, endings, batch_size)


def hmean(bleu: float, ents: float) -> float:
    """EDUCAT's HMean: the harmonic mean of corpus BLEU (0-100, scaled to 0-1) and mean EntScore."""
    b = bleu / 100
    return 0.0 if b + ents == 0 else 2 * b * ents / (b + ents)
