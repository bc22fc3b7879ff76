"""BERTScore (Zhang et al., 2020), computed by its authors' package `bert_score`: the F1 of a
greedy matching of the prediction's and the reference's tokens by the cosine of their contextual
embeddings at one layer of an encoder (no idf weighting, the package's default).

Optional, as BARTScore is not: `models.bertscore` names the encoder (null, the default: no
BERTScore column anywhere). Its usual model, `roberta-large` at layer 17, needs the hub;
offline, `bundled:all-minilm-l6-v2` runs it (a smaller encoder, so its values are not comparable
with published roberta-large figures). `score.bertscore_layer` picks the layer: null takes the
package's own default for a hub model it knows; `score.bertscore_rescale` rescales with the
package's baseline for that model (Zhang et al.'s rescaling: same ranking, a wider spread).
"""
from __future__ import annotations

import warnings
from pathlib import Path

import torch

from storyrewrite.io import InputError

# `bert_score` 0.3.13 predates transformers 5, where three of its assumptions no longer hold;
# `_fit_tokenizer` restores them on our instance of the scorer (tests/metrics/test_bertscore.py
# checks its values against the formula computed with transformers alone).


def _fit_tokenizer(tokenizer, config, directory: str | Path):
    """The tokenizer `bert_score` expects, from the one it loaded under transformers 5:
    - it encodes RoBERTa and GPT-2 text with a space before the first word, by passing
      `add_prefix_space=True` to `encode`, which transformers 5 ignores: a tokenizer loaded with
      that setting does it;
    - it encodes an empty sentence with `build_inputs_with_special_tokens([])`, which transformers
      5 removed: the special tokens alone are what `encode("")` gives (the package then sets an
      empty prediction's raw score to 0, as it documents);
    - it truncates to `model_max_length`, which a tokenizer without a limit of its own sets to a
      sentinel too large for the Rust tokenizer: the model's positions are the limit then."""
    from transformers import AutoTokenizer, GPT2Tokenizer, RobertaTokenizer

    if isinstance(tokenizer, (GPT2Tokenizer, RobertaTokenizer)):
        tokenizer = AutoTokenizer.from_pretrained(directory, add_prefix_space=True)
    special = tokenizer.encode("", add_special_tokens=True)
    tokenizer.build_inputs_with_special_tokens = lambda token_ids: list(special)  # called with [] only
    positions = getattr(config, "max_position_embeddings", None)
    if positions and tokenizer.model_max_length > positions:
        # RoBERTa-like models number positions from pad_token_id + 1
        offset = config.pad_token_id + 1 if config.model_type in ("roberta", "xlm-roberta", "camembert") else 0
        tokenizer.model_max_length = positions - offset
    return tokenizer


# The hub moved its first models into these organisations (roberta-large is now
# FacebookAI/roberta-large, bert-base-uncased google-bert/bert-base-uncased); `bert_score`'s
# tables know them by their old names, which the hub still resolves.
HUB_LEGACY_ORGS = ("FacebookAI", "google-bert", "distilbert", "xlnet", "albert", "google-t5", "openai-community")


def _package_name(spec: str) -> str:
    """The name `bert_score`'s tables know the hub model `spec` by."""
    from bert_score.utils import model2layers

    org, _, name = spec.partition("/")
    return name if spec not in model2layers and org in HUB_LEGACY_ORGS and name in model2layers else spec


def default_layer(spec: str) -> int | None:
    """The layer `bert_score` uses for the hub model `spec` (roberta-large or
    FacebookAI/roberta-large: 17), None if it knows no such model."""
    from bert_score.utils import model2layers

    return model2layers.get(_package_name(spec))


def baseline_file(spec: str) -> Path | None:
    """The rescaling baseline `bert_score` ships for the hub model `spec` (English), if any."""
    import bert_score

    path = Path(bert_score.__file__).parent / "rescale_baseline" / "en" / f"{_package_name(spec)}.tsv"
    return path if path.exists() else None


class BERTScore:
    """A loaded BERTScore model: `f1(predictions, references)` per pair, a reference being one
    string or several (the best of them, as the package takes it)."""

    def __init__(self, directory: str | Path, spec: str, layer: int | None = None, rescale: bool = False,
                 device: torch.device | str = "cpu"):
        from bert_score import BERTScorer
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(directory)
        layers = getattr(config, "num_hidden_layers", None)
        layer = layer if layer is not None else default_layer(spec)
        if layer is None:
            raise InputError(f"params: `score.bertscore_layer` is null and `models.bertscore` = {spec!r} is not a model "
                             f"bert_score has a default layer for; name the layer (1 to {layers})", key="score.bertscore_layer")
        if layers is not None and not 1 <= layer <= layers:
            raise InputError(f"params: `score.bertscore_layer` = {layer}: `models.bertscore` = {spec!r} has layers 1 to {layers}", key="score.bertscore_layer")
        baseline = None
        if rescale:
            baseline = baseline_file(spec)
            if baseline is None:
                raise InputError(f"params: `score.bertscore_rescale` is true but bert_score has no baseline for "
                                 f"`models.bertscore` = {spec!r} (it has them for hub models such as roberta-large)", key="score.bertscore_rescale")
        self.spec, self.layer, self.rescale = spec, layer, rescale
        self.scorer = BERTScorer(model_type=str(directory), num_layers=layer, lang="en", rescale_with_baseline=rescale,
                                 baseline_path=None if baseline is None else str(baseline), device=str(device))
        self.scorer._tokenizer = _fit_tokenizer(self.scorer._tokenizer, config, directory)

    def f1(self, predictions: list[str], references: list[str] | list[list[str]], batch_size: int = 16) -> list[float]:
        if not predictions:
            return []
        with warnings.catch_warnings():
            # It reads the rescaling baseline through a read-only pandas array into a tensor it never writes.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            _, _, f1 = self.scorer.score(predictions, references, batch_size=batch_size)
        return f1.tolist()
