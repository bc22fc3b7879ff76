"""Sentence embeddings from an encoder (the embedder of drift similarity, the retriever of RAG).

How token vectors become one sentence vector follows the model: a sentence-transformers
directory (all-MiniLM-L6-v2, bundled) says it in `1_Pooling/config.json` (mean pooling) and
`modules.json` (a `Normalize` module: unit vectors), as its model card says; a plain encoder
(bert-base-uncased) gives its [CLS] vector, unnormalised, as Qin et al.'s drift similarity
takes it. Batches are length-sorted (little padding); every sentence gets the vector it would
get alone.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModel, AutoTokenizer

from storyrewrite.io import InputError

POOLING_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean", "pooling_mode_max_tokens": "max"}


def read_pooling(model_dir: Path) -> tuple[str, bool, int | None]:
    """(pooling: cls | mean | max, whether vectors are normalised, the max sequence length) of
    a model directory: a sentence-transformers model's own, else [CLS] unnormalised."""
    modules_file = model_dir / "modules.json"
    if not modules_file.exists():
        return "cls", False, None
    modules = json.loads(modules_file.read_text(encoding="utf-8"))
    types = [module["type"].rsplit(".", 1)[-1] for module in modules]
    pooling_module = next((m for m in modules if m["type"].endswith(".Pooling")), None)
    if pooling_module is None:
        raise InputError(f"{modules_file}: a sentence-transformers model without a Pooling module")
    config = json.loads((model_dir / pooling_module["path"] / "config.json").read_text(encoding="utf-8"))
    modes = [mode for key, mode in POOLING_MODES.items() if config.get(key)]
    if len(modes) != 1:
        raise InputError(f"{model_dir / pooling_module['path'] / 'config.json'}: pooling must be exactly one of "
                         f"{', '.join(POOLING_MODES.values())}; the file enables {', '.join(modes) or 'none'}")
    settings = model_dir / "sentence_bert_config.json"
    max_length = json.loads(settings.read_text(encoding="utf-8")).get("max_seq_length") if settings.exists() else None
    return modes[0], "Normalize" in types, max_length


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """B×L×d token vectors and their B×L mask -> B×d sentence vectors."""
    if mode == "cls":
        return hidden[:, 0]
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    if mode == "mean":
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
    return hidden.masked_fill(weights == 0, torch.finfo(hidden.dtype).min).amax(dim=1)


class SentenceEncoder:
    def __init__(self, model_dir: str | Path, device: torch.device | str = "cpu", batch_size: int = 64, max_length: int = 256):
        model_dir = Path(model_dir)
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModel.from_pretrained(model_dir).to(self.device).eval()
        self.pooling, self.normalize, card_length = read_pooling(model_dir)
        self.max_length = min(max_length, card_length or max_length)
        self.batch_size = batch_size

    @torch.inference_mode()
    def embed(self, texts: list[str]) -> torch.Tensor:
        """N×d float32 sentence vectors, on the CPU, in the order of `texts`."""
        if not texts:
            return torch.zeros(0, self.model.config.hidden_size)
        lengths = [len(ids) for ids in self.tokenizer(texts, truncation=True, max_length=self.max_length)["input_ids"]]
        order = sorted(range(len(texts)), key=lambda i: -lengths[i])
        # The vectors stay on the device until every batch is queued, read back in one copy (a
        # read per batch would make the host wait for each batch before it tokenises the next).
        batches = []
        for start in range(0, len(order), self.batch_size):
            chosen = order[start : start + self.batch_size]
            inputs = self.tokenizer([texts[i] for i in chosen], padding=True, truncation=True, max_length=self.max_length,
                                    return_tensors="pt").to(self.device)
            pooled = pool(self.model(**inputs).last_hidden_state, inputs["attention_mask"], self.pooling).float()
            if self.normalize:
                pooled = torch.nn.functional.normalize(pooled, dim=-1)
            batches.append(pooled)
        vectors = torch.empty(len(texts), self.model.config.hidden_size)
        vectors[order] = torch.cat(batches).cpu()
        return vectors
