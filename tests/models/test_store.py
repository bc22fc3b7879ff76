import json
import shutil
from itertools import combinations, pairwise
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoTokenizer

from storyrewrite.io import InputError
from storyrewrite.params import ModelsConfig
from storyrewrite.models.materialise import materialise, spec_dir
from storyrewrite.models.catalogue import BUNDLED, ROLES, TINY, catalogued, check_specs, is_path
from storyrewrite.models.roles import check_role, check_same_vocabulary, shape_of
from storyrewrite.models.specs import fetch, load_from_source
from storyrewrite.models.store import (is_seq2seq, load_model, load_tokenizer, optional_model_dir, plain_decoding, resolve_model_dir,
                                       save_model)
from storyrewrite.models.tiny import package_dir


def test_materialised_tiny_models(tiny_model_dirs):
    assert is_seq2seq(tiny_model_dirs["bart"]) and not is_seq2seq(tiny_model_dirs["llama"])
    bart_tok = load_tokenizer(tiny_model_dirs["bart"])
    assert bart_tok.sep_token == "</s>"
    llama_tok = load_tokenizer(tiny_model_dirs["llama"])
    assert llama_tok.pad_token == llama_tok.eos_token  # causal LMs get eos as pad


def test_a_tiny_tokenizer_is_gpt2s_bpe_with_its_first_merges(tiny_model_dirs):
    """The tiny models' tokenizer against a hand BPE: GPT-2's byte-level words (its own
    pre-tokenizer), each merged by rank with the first TINY_MERGES of GPT-2's merges, and numbered
    as GPT-2 numbers them; the text comes back whole."""
    from transformers import GPT2Tokenizer

    from storyrewrite.models.tiny import TINY_MERGES, gpt2_bpe_files

    vocab, merges = gpt2_bpe_files()
    full = GPT2Tokenizer(vocab=vocab, merges=merges)
    ranks = {pair: rank for rank, pair in enumerate(merges[:TINY_MERGES])}

    def hand_bpe(word: str) -> list[str]:
        parts = list(word)
        while len(parts) > 1:
            rank, at = min((ranks.get(pair, len(ranks)), i) for i, pair in enumerate(pairwise(parts)))
            if rank == len(ranks):
                break
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        return parts

    text = "Ann baked a cake for her mother's birthday. She burnt it; the kitchen filled with smoke!\nÉclairs, 1984."
    words = [word for word, _ in full.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)]
    expected = [vocab[token] for word in words for token in hand_bpe(word)]
    tiny = load_tokenizer(tiny_model_dirs["llama"])
    assert tiny(text)["input_ids"] == expected and tiny.decode(expected) == text
    assert len(tiny) == 256 + TINY_MERGES + 1 and tiny.eos_token_id == 256 + TINY_MERGES
    assert len(expected) > len(full(text)["input_ids"])  # (fewer merges: more tokens)


def test_materialise_round_trip_is_exact(tmp_path):
    model, tokenizer = load_from_source("tiny:llama", seed=0)
    materialise(ModelsConfig(generator="tiny:llama", scorer="tiny:llama", max_input_tokens=32, max_output_tokens=16), tmp_path, seed=0)
    assert json.loads((tmp_path / "index.json").read_text()) == {
        "generator": "tiny--llama", "scorer": "tiny--llama", "specs": {"generator": "tiny:llama", "scorer": "tiny:llama"}}
    reloaded = load_model(resolve_model_dir(tmp_path, "scorer"))
    ids = torch.tensor([tokenizer("Once upon a time")["input_ids"]])
    torch.testing.assert_close(model(input_ids=ids).logits, reloaded(input_ids=ids).logits, atol=0, rtol=0)


def test_a_spec_another_models_stage_holds_is_copied_from_there_and_the_rest_fetched(tmp_path, monkeypatch):
    """eval_models with --reuse models/pretrained: the judge of the generator's spec is copied (the
    same files, no fetch), the embedder, of a spec the other stage lacks, fetched as before."""
    from storyrewrite.models import materialise as module

    config = ModelsConfig(generator="tiny:llama", scorer="tiny:llama", judge="tiny:llama", embedder="tiny:roberta",
                          max_input_tokens=32, max_output_tokens=16)
    materialise(config, tmp_path / "pretrained", seed=0)
    fetched = []
    original = module.fetch
    monkeypatch.setattr(module, "fetch", lambda spec, kind, dest, seed: (fetched.append((spec, kind)), original(spec, kind, dest, seed)))
    index = materialise(config, tmp_path / "evaluators", seed=0, roles=("judge", "embedder"), reuse=tmp_path / "pretrained")
    assert fetched == [("tiny:roberta", "encoder")]
    assert index["judge"] == "tiny--llama"
    copied, source = tmp_path / "evaluators" / "tiny--llama", tmp_path / "pretrained" / "tiny--llama"
    assert sorted(p.name for p in copied.iterdir()) == sorted(p.name for p in source.iterdir())
    assert all((copied / p.name).read_bytes() == p.read_bytes() for p in source.iterdir() if p.is_file())
    # Without it (or with a folder that is no models stage's output) every spec is fetched.
    fetched.clear()
    materialise(config, tmp_path / "alone", seed=0, roles=("judge",), reuse=tmp_path / "nothing-here")
    assert fetched == [("tiny:llama", "lm")]
    # A folder of the spec's name that the other stage's index does not name (left by another spec): fetched too.
    shutil.copytree(tmp_path / "pretrained", tmp_path / "stale")
    (tmp_path / "stale" / "index.json").write_text(json.dumps({"generator": "tiny--llama", "specs": {"generator": "tiny-llama"}}))
    fetched.clear()
    materialise(config, tmp_path / "again", seed=0, roles=("judge",), reuse=tmp_path / "stale")
    assert fetched == [("tiny:llama", "lm")]


def test_a_spec_is_materialised_under_a_plain_name_one_per_kind(tmp_path):
    assert spec_dir(tmp_path, "facebook/bart-large-cnn") == tmp_path / "facebook--bart-large-cnn"
    assert spec_dir(tmp_path, "./runs/a/model/") == tmp_path / "runs--a--model"  # no hidden folder, no trailing dash
    assert spec_dir(tmp_path, "/home/me/nli", "classifier") == tmp_path / "home--me--nli--classifier"
    # One directory in two roles of two kinds (an NLI classifier's encoder for BERTScore): two models, each of its class.
    fetch("tiny:roberta-nli", "classifier", tmp_path / "mnli")
    spec = str(tmp_path / "mnli")
    config = ModelsConfig(generator="tiny:llama", scorer="tiny:llama", bertscore=spec, nli=spec, max_input_tokens=32, max_output_tokens=16)
    index = materialise(config, tmp_path / "evaluators", seed=0, roles=("bertscore", "nli"))
    assert index["bertscore"] == spec_dir(".", spec, "encoder").name and index["nli"] == spec_dir(".", spec, "classifier").name
    architectures = {role: AutoConfig.from_pretrained(tmp_path / "evaluators" / index[role]).architectures for role in ("bertscore", "nli")}
    assert architectures == {"bertscore": ["RobertaModel"], "nli": ["RobertaForSequenceClassification"]}


def test_a_role_whose_spec_is_null_has_no_model_and_a_role_not_materialised_is_an_error(tmp_path):
    config = ModelsConfig(generator="tiny:llama", scorer="tiny:llama", judge=None, max_input_tokens=32, max_output_tokens=16)
    materialise(config, tmp_path / "evaluators", seed=0, roles=("judge",))
    assert optional_model_dir(tmp_path / "evaluators", "judge") is None
    with pytest.raises(InputError, match=r"evaluators: no judge model \(is `models.judge` null\?\)$"):
        resolve_model_dir(tmp_path / "evaluators", "judge")
    with pytest.raises(InputError, match=r"evaluators: no embedder model \(is `models.embedder` null\?\)$"):
        optional_model_dir(tmp_path / "evaluators", "embedder")  # (a stage asked for a role its models stage never had)


def test_a_local_model_directory_is_a_spec_of_its_own_kind(tmp_path):
    """A model saved with save_pretrained (a researcher's own) is a spec: a seq2seq one loads as
    seq2seq and a causal one as causal, with the saved weights; an encoder directory's
    sentence-transformers pooling files come with it."""
    from storyrewrite.models.specs import SENTENCE_TRANSFORMERS_FILES

    own = {kind: tmp_path / f"own-{kind}" for kind in ("bart", "llama", "roberta")}
    models = {}
    for kind, directory in own.items():
        model, tokenizer = load_from_source(f"tiny:{kind}", seed=3, kind="encoder" if kind == "roberta" else "lm")
        models[kind] = model.eval()  # (built in training mode: dropout)
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
    for name in SENTENCE_TRANSFORMERS_FILES:
        (own["roberta"] / name).parent.mkdir(parents=True, exist_ok=True)
        (own["roberta"] / name).write_text(json.dumps({"file": name}))
    bart, llama, roberta = (str(own[kind]) for kind in ("bart", "llama", "roberta"))
    config = ModelsConfig(generator=bart, scorer=bart, embedder=roberta, max_input_tokens=32, max_output_tokens=16)
    index = materialise(config, tmp_path / "pretrained", seed=0, roles=("generator", "scorer", "embedder"))
    assert index["specs"] == {"generator": bart, "scorer": bart, "embedder": roberta}
    generator = resolve_model_dir(tmp_path / "pretrained", "generator")
    assert is_seq2seq(generator) and resolve_model_dir(tmp_path / "pretrained", "scorer") == generator
    embedder = resolve_model_dir(tmp_path / "pretrained", "embedder")
    assert all(json.loads((embedder / name).read_text()) == {"file": name} for name in SENTENCE_TRANSFORMERS_FILES)
    model, _ = load_from_source(llama)
    assert not model.config.is_encoder_decoder and type(model).__name__ == "LlamaForCausalLM"
    ids = torch.tensor([[5, 6, 7, 8]])
    torch.testing.assert_close(model(input_ids=ids).logits, models["llama"](input_ids=ids).logits, atol=0, rtol=0)
    reloaded = load_model(generator)
    torch.testing.assert_close(reloaded(input_ids=ids, decoder_input_ids=ids).logits,
                               models["bart"](input_ids=ids, decoder_input_ids=ids).logits, atol=0, rtol=0)


def test_generator_and_scorer_must_share_a_vocabulary(tmp_path):
    with pytest.raises(InputError, match=r"`models.generator` \(tiny:bart, 8454 tokens\) and `models.scorer` \(tiny:llama, 8449 tokens\) do not share a vocabulary"):
        materialise(ModelsConfig(generator="tiny:bart", scorer="tiny:llama", max_input_tokens=32, max_output_tokens=16), tmp_path, seed=0)


def test_unknown_specs_list_valid_ones():
    with pytest.raises(InputError, match=r"unknown tiny model `tiny:t5`; valid: tiny:bart, tiny:llama, tiny:roberta, tiny:roberta-nli"):
        load_from_source("tiny:t5")
    with pytest.raises(InputError, match=r"unknown bundled model `bundled:gpt5`; valid: bundled:smollm2-135m-instruct, bundled:all-minilm-l6-v2"):
        load_from_source("bundled:gpt5")


def test_a_spec_that_names_no_model_it_can_reach_names_the_role_and_the_valid_sources(tmp_path):
    config = ModelsConfig(generator="tiny:llama", scorer="tiny:llama", max_input_tokens=32, max_output_tokens=16,
                          bertscore=str(tmp_path / "no-such-model"))
    with pytest.raises(InputError, match=r"`models.bertscore` = '.*no-such-model' cannot be loaded \(no such directory\); "
                                         r"a spec is a local model directory, a Hugging Face hub name .*bundled:all-minilm-l6-v2 or "
                                         r"tiny:bart, tiny:llama, tiny:roberta, tiny:roberta-nli"):
        materialise(config, tmp_path / "out", seed=0, roles=("bertscore",))
    assert not (tmp_path / "out").exists()  # nothing half-written


@pytest.mark.parametrize("generator, scorer, message", [
    ("tiny:roberta", "tiny:llama", r"^params: `models\.generator` = 'tiny:roberta' is a roberta model, not a seq2seq or causal LM, "
                                   r"which the generator needs: it is trained to write the ending"),
    ("tiny:llama", "tiny:roberta-nli", r"^params: `models\.scorer` = 'tiny:roberta-nli' is a roberta model, not a seq2seq or causal "
                                       r"LM, which the scorer needs: it scores the ending token by token"),
    ("bundled:gpt5", "tiny:llama", r"^params: `models\.generator` = 'bundled:gpt5': unknown bundled model `bundled:gpt5`; "
                                   r"valid: bundled:smollm2-135m-instruct, bundled:all-minilm-l6-v2$"),
])
def test_a_generator_or_scorer_that_is_no_language_model_is_refused_naming_its_param(tmp_path, generator, scorer, message):
    # Such a model used to be materialised as either and loaded as a causal LM (RobertaForCausalLM,
    # BertLMHeadModel) with a new, random LM head and attention that sees the tokens ahead: it trained, on a leak.
    config = ModelsConfig(generator=generator, scorer=scorer, max_input_tokens=32, max_output_tokens=16)
    with pytest.raises(InputError, match=message):
        materialise(config, tmp_path / "out", seed=0)
    assert not (tmp_path / "out").exists()  # nothing half-written


CATALOGUED = [*(f"tiny:{kind}" for kind in TINY), "bundled:all-minilm-l6-v2"]  # SmolLM2: the slow test below


@pytest.fixture(scope="module")
def catalogued_dirs(tmp_path_factory) -> dict[str, Path]:
    """spec -> the model it names, fetched (a tiny or bundled model is what it is, whatever role asks)."""
    out = tmp_path_factory.mktemp("catalogued")
    for index, spec in enumerate(CATALOGUED):
        fetch(spec, "lm", out / str(index))
    return {spec: out / str(index) for index, spec in enumerate(CATALOGUED)}


def _refusals(check, *args) -> list[str]:
    """The error a check raises, as check_specs lists its own: [] when it passes."""
    try:
        check(*args)
    except InputError as error:
        return [str(error)]
    return []


@pytest.mark.parametrize("spec", CATALOGUED)
def test_the_catalogue_says_of_a_model_what_the_model_itself_shows(catalogued_dirs, spec):
    """What storyrewrite.models.catalogue writes of a model (which `profiles check` reads without
    loading it) against the model's own config and tokenizer; and for each role, the check of the
    spec refuses where the check of the fetched model does, in the same words."""
    directory, model = catalogued_dirs[spec], catalogued(spec)
    assert shape_of(AutoConfig.from_pretrained(directory)) == model.shape
    assert len(AutoTokenizer.from_pretrained(directory)) == model.tokens
    for role in ROLES:
        assert [str(error) for error in check_specs({role: spec})] == _refusals(check_role, role, directory, spec), role


# Which role each catalogued model can play, written out by hand from the table of roles in
# storyrewrite.models.catalogue (the check derives it from the models' shapes).
CAN_PLAY = {
    "tiny:bart": {"generator", "scorer"},  # seq2seq: no causal judge, no encoder
    "tiny:llama": {"generator", "scorer", "judge"},  # decoder-only
    "tiny:roberta": {"embedder", "bertscore"},  # an encoder, no classifier head
    "tiny:roberta-nli": {"embedder", "bertscore", "nli"},  # an encoder with an entailment head
    "bundled:all-minilm-l6-v2": {"embedder", "bertscore"},
    "bundled:smollm2-135m-instruct": {"generator", "scorer", "judge"},
}


@pytest.mark.parametrize("spec", sorted(CAN_PLAY))
def test_each_catalogued_model_plays_the_roles_its_shape_allows_and_no_other(spec):
    assert {role for role in ROLES if not check_specs({role: spec})} == CAN_PLAY[spec]


def test_an_empty_catalogue_name_is_refused_with_the_valid_ones():
    # (not taken for a hub name, which would fail later at its stage)
    assert [str(error) for error in check_specs({"generator": "tiny:"})] == [
        "params: `models.generator` = 'tiny:': unknown tiny model `tiny:`; valid: tiny:bart, tiny:llama, tiny:roberta, tiny:roberta-nli"]


def test_a_spec_is_a_directory_when_it_reads_as_a_path_there_or_not(tmp_path):
    assert is_path("~/nll") and is_path("./nll") and is_path("runs/a/model") and is_path(str(tmp_path))
    assert not is_path("facebook/bart-large-cnn") and not is_path("gpt2")


def test_two_catalogued_models_share_a_vocabulary_exactly_when_the_catalogue_says_so(catalogued_dirs):
    tokenizers = {spec: AutoTokenizer.from_pretrained(directory) for spec, directory in catalogued_dirs.items()}
    for first, second in combinations(CATALOGUED, 2):
        same = catalogued(first).vocabulary == catalogued(second).vocabulary
        assert same == (tokenizers[first].get_vocab() == tokenizers[second].get_vocab()), (first, second)
        if all(check_specs({"generator": spec}) == [] for spec in (first, second)):  # two LMs: the check of the loaded tokenizers
            assert [str(error) for error in check_specs({"generator": first, "scorer": second})] == _refusals(
                check_same_vocabulary, tokenizers[first], tokenizers[second], (first, second))


def test_a_language_model_whose_tokenizer_has_no_end_token_is_refused_naming_its_role(tmp_path):
    # Every target ends with the end token, and CF-PMI scores it after the ending: without one, each would be cut short.
    fetch("tiny:llama", "lm", tmp_path / "lm")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "lm")
    tokenizer.eos_token = None  # (the pad token, the same text, stays)
    tokenizer.save_pretrained(tmp_path / "lm")
    assert AutoTokenizer.from_pretrained(tmp_path / "lm").eos_token_id is None
    spec = str(tmp_path / "lm")
    config = ModelsConfig(generator=spec, scorer=spec, max_input_tokens=32, max_output_tokens=16, judge=spec)
    with pytest.raises(InputError, match=rf"^params: `models.generator` = '{spec}': its tokenizer has no end-of-text token, "
                                         "which ends every target it is trained on or scores$"):
        materialise(config, tmp_path / "out", seed=0)
    with pytest.raises(InputError, match=rf"^params: `models.judge` = '{spec}': its tokenizer has no end-of-text token, "
                                         "which CF-PMI scores after the ending"):
        materialise(config, tmp_path / "evaluators", seed=0, roles=("judge",))
    assert not (tmp_path / "out").exists() and not (tmp_path / "evaluators").exists()


def test_a_causal_lm_without_a_pad_token_pads_with_its_end_token(tmp_path):
    # (as GPT-2 and many causal LMs on the hub: a batch's padding is masked, so eos serves)
    model, tokenizer = load_from_source("tiny:llama")
    tokenizer.pad_token, model.config.pad_token_id = None, None
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path).pad_token is None
    model, tokenizer = load_from_source(str(tmp_path))
    assert tokenizer.pad_token == tokenizer.eos_token is not None
    assert model.config.pad_token_id == tokenizer.pad_token_id == tokenizer.eos_token_id


def test_resolve_model_dir_rejects_a_non_model(tmp_path):
    with pytest.raises(InputError, match="not a model directory"):
        resolve_model_dir(tmp_path)


@pytest.mark.slow
def test_bundled_smollm2_materialises_exactly(tmp_path, monkeypatch):
    """The GGUF model is de-quantised once, its file parsed once (transformers alone parses it
    three times) over a plain array, into the fields and tensors gguf's own reader gives; the
    embeddings are gguf's own de-quantisation of the file's tensor, and the saved copy gives the
    same logits."""
    import gguf
    import numpy as np
    from gguf.gguf_reader import GGUFReader

    readers = []

    def init(self, *args, **kwargs):
        readers.append(self)
        real_init(self, *args, **kwargs)

    real_init, package_reader = GGUFReader.__init__, gguf.GGUFReader
    monkeypatch.setattr(GGUFReader, "__init__", init)
    model, tokenizer = load_from_source("bundled:smollm2-135m-instruct")
    monkeypatch.undo()
    assert type(model).__name__ == "LlamaForCausalLM" and len(tokenizer) == 49152
    assert shape_of(model.config) == BUNDLED["smollm2-135m-instruct"].shape and len(tokenizer) == BUNDLED["smollm2-135m-instruct"].tokens
    assert len(readers) == 1 and gguf.GGUFReader is package_reader  # parsed once; the patch undone
    assert type(readers[0].data) is np.ndarray and not readers[0].data.flags.writeable
    bundled = BUNDLED["smollm2-135m-instruct"]
    own = GGUFReader(package_dir(bundled.package) / bundled.file)
    assert list(own.fields) == list(readers[0].fields)
    assert all(np.array_equal(a, b) for name in own.fields for a, b in zip(own.fields[name].parts, readers[0].fields[name].parts,
                                                                            strict=True))
    embedding = next(t for t in own.tensors if t.name == "token_embd.weight")
    want = torch.from_numpy(gguf.dequantize(embedding.data, embedding.tensor_type).copy()).float()
    torch.testing.assert_close(model.get_input_embeddings().weight.detach(), want, atol=0, rtol=0)
    save_model(model, tokenizer, tmp_path / "smol")
    assert "quantization_config" not in json.loads((tmp_path / "smol" / "config.json").read_text())
    reloaded = load_model(tmp_path / "smol")
    ids = torch.tensor([tokenizer("Premise: Ann baked a cake.\nEdited ending:")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, reloaded(input_ids=ids).logits, atol=0, rtol=0)


def test_a_models_identity_is_its_weights(tiny_model_dirs, tmp_path):
    """weights_digest (what the LLM cache and the generation fingerprint know a model by) reads
    the weights' bytes: a copy has the digest of its original, other weights of the same files
    another. same_model (whether eval_models may copy a model) holds only for the same spec and
    weight files of the same sizes."""
    import shutil

    from storyrewrite.models.store import same_model, weights_digest

    original = tiny_model_dirs["llama"]
    copy, changed = tmp_path / "copy", tmp_path / "changed"
    shutil.copytree(original, copy)
    model = load_model(original)
    with torch.no_grad():
        model.get_input_embeddings().weight[0, 0] += 1.0
    save_model(model, load_tokenizer(original), changed)
    assert weights_digest(copy) == weights_digest(original) != weights_digest(changed)
    assert same_model(original, "tiny:llama", copy, "tiny:llama") and not same_model(original, "tiny:llama", copy, "tiny:bart")
    assert not same_model(original, "tiny:llama", tiny_model_dirs["bart"], "tiny:llama")  # other weight files


def test_plain_decoding_keeps_the_checkpoints_special_tokens_and_nothing_else(tiny_model_dirs):
    """Under plain_decoding a checkpoint's decoding defaults are gone and its special tokens kept:
    its end tokens (a chat model's end-of-turn among them), pad and decoder-start tokens."""
    model = load_model(tiny_model_dirs["bart"])
    end = model.config.eos_token_id
    model.generation_config.update(num_beams=4, min_length=5, no_repeat_ngram_size=3, forced_bos_token_id=7, eos_token_id=[end, 9])
    saved = model.generation_config
    with plain_decoding(model) as plain:
        config = plain.generation_config
        # (unset: the call's own settings, else transformers' defaults: one beam, no minimum, no blocking)
        assert (config.num_beams, config.min_length, config.no_repeat_ngram_size, config.forced_bos_token_id) == (None,) * 4
        assert config.eos_token_id == [end, 9] and config.pad_token_id == saved.pad_token_id is not None
        assert config.decoder_start_token_id == model.config.decoder_start_token_id is not None
    assert model.generation_config is saved
