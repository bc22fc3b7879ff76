"""RLOO: REINFORCE with a leave-one-out baseline (Ahmadian et al. 2024) on the reward that DTO
optimises through Gumbel-softmax, here on discrete samples: the policy-gradient baseline of the
comparison with DTO.

Per training instance x, K endings ŷ_1..ŷ_K are sampled from the current generator (`rl.samples`;
temperature `rl.temperature`, no top-k/top-p and none of the checkpoint's decoding defaults, so
that the samples come from π itself; at most `rl.max_new_tokens` new tokens; eval mode, no
gradient, no autocast: the weights in their own dtype, or in `rl.sample_dtype`), seeded by the
run's seed and the step. With the dynamic cache a causal model reads each source once for its K
samples (`shared_prefix`); transformers' num_return_sequences would read it K times.
Each gets the reward of `rl.reward`, the frozen scorer's M (BARTScore) with the discrete sample
as its source, as DTO's soft ending is:

  score        r = M(ŷ, Y_EE)
  delta        r = M(ŷ, Y_EE) − M(ŷ, X_OE)
  score_delta  r = 2·M(ŷ, Y_EE) − M(ŷ, X_OE)

minus `rl.kl_beta` · Σ_t [log π(ŷ_t | x, ŷ_<t) − log π_ref(ŷ_t | x, ŷ_<t)] against the starting
model (the NLL model; `kl_beta: 0` loads no reference model). The advantage of sample k is

  leave_one_out  A_k = r_k − (1/(K−1)) Σ_{j≠k} r_j
  greedy         A_k = r_k − r(greedy decode)          (self-critical, Rennie et al. 2017)

and the loss, from one teacher-forced pass over the B·K samples with gradient (in the module's
mode, as every objective's forward; padding and tokens after the end token get no weight; each
source read once for its K samples, `sequence_log_probs`), one update per batch (no ratio
clipping: the samples come from the policy being updated):

  L = −(1/(B·K)) Σ_b Σ_k A_{b,k} · Σ_t log π(ŷ_{b,k,t} | x_b, ŷ_{b,k,<t})

log π is taken at the sampling temperature (logits / T, as TRL does), so that the score function
is that of the distribution sampled. In validation the loss is −mean r (the samples' mean reward,
drawn with a fixed seed per batch): the best checkpoint is the one whose samples score best.

`rl.cache: static` samples with a fixed-size KV cache, sized for the longest source, so that on a
GPU transformers compiles the decoding step and replays it as a CUDA graph, one graph per row
count: the samples of the dynamic cache, without a kernel launch per operator of each new token.
It compiles once in a run, with the row count symbolic (`Sampling.compile_config`), whatever the
row counts of the training and validation batches.
The run keeps one such cache per row count and reuses it at every step (`StaticCaches`).
Where the compile fails, the run goes on with the dynamic cache, the same samples (`Sampling`).
`rl.early_stop: false` decodes `rl.max_new_tokens` steps without the host read per token with
which transformers checks whether every sample has ended (`stop_at_max_length`): the same samples.
`rl.sample_dtype` (say bfloat16 under bf16-mixed) samples from a copy of the generator with its
parameters in that dtype, refreshed from the trained weights before each sampling (`Sampling`):
on a GPU the decoding's matrix products and attention then run in half precision, where the
float32 weights run float32 kernels. Autocast's forward, which the loss differentiates, rounds
the linear weights the same way; the copy also keeps its residual stream in that dtype.
The curves split a step's sampling in two: `sample_time_share`, all of it, and
`sample_read_time_share`, the read of the samples at its end. Without early stop on a GPU that
read is where the host waits for the decoding it queued; the rest is the host's own time.
"""
from __future__ import annotations

import copy
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager, nullcontext

import torch
from transformers import CompileConfig, DynamicCache, EncoderDecoderCache, GenerationConfig, PreTrainedModel, StaticCache
from transformers.generation import utils as generation_utils

from storyrewrite.io import InputError
from storyrewrite.metrics.lm_scorer import LMScorer
from storyrewrite.models.encoding import Encoder, generated_tokens, pair_logits, position_ids, target_logits
from storyrewrite.models.logprobs import token_log_probs
from storyrewrite.models.store import is_seq2seq, load_model, load_tokenizer, plain_decoding
from storyrewrite.objectives.base import Loss, LossOutput, ObjectiveContext
from storyrewrite.objectives.nll import nll_loss
from storyrewrite.objectives.registry import RLConfig
from storyrewrite.records import compile_counts, dynamo_frames


def leave_one_out_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """A_k = r_k − mean of the other K−1 rewards of the same instance: rewards B×K -> B×K (K ≥ 2)."""
    samples = rewards.shape[1]
    return rewards - (rewards.sum(dim=1, keepdim=True) - rewards) / (samples - 1)


def rloo_loss(sequence_logps: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """L = −mean over instances and samples of A · log π(ŷ | x): both B×K, the advantages held constant."""
    return -(advantages.detach() * sequence_logps).mean()


def combine_rewards(m_target: torch.Tensor, m_original: torch.Tensor | None, reward: str) -> torch.Tensor:
    """The metric reward of `rl.reward` from M(ŷ, Y_EE) and M(ŷ, X_OE) (None for `score`)."""
    if reward == "score":
        return m_target
    return m_target - m_original if reward == "delta" else 2 * m_target - m_original


def completion_ids(new_tokens: torch.Tensor, eos_id: int) -> tuple[list[list[int]], list[bool]]:
    """Each generated continuation (rows of new tokens) up to and with its first end token, and
    whether it ended there (False: it hit the token limit; then it is taken whole, as no padding
    follows a sequence that has not ended)."""
    rows, ended = [], []
    for row in new_tokens.tolist():
        if eos_id in row:
            rows.append(row[: row.index(eos_id) + 1])
            ended.append(True)
        else:
            rows.append(row)
            ended.append(False)
    return rows, ended


def sequence_log_probs(generator: PreTrainedModel, encoder: Encoder, source_ids: list[list[int]],
                       completions: list[list[int]], temperature: float = 1.0) -> torch.Tensor:
    """log π(ŷ | x) = Σ_t log π(ŷ_t | x, ŷ_<t) of each completion (token ids, its end token
    included) after its source (token ids, unpadded), teacher-forced, at the sampling
    temperature: R (float32). Padding gets no weight. Where sources repeat (a step's K samples
    of each), each is read once (`pair_logits`): the forward, and in training its backward, then
    cost about a source and K completions an instance, not K of both."""
    device = next(generator.parameters()).device
    batch = {k: v.to(device) for k, v in encoder.pair_batch(source_ids, completions).items()}
    logps = token_log_probs(pair_logits(generator, batch) / temperature, batch["target_ids"])  # R×T
    return (logps * batch["target_mask"].to(logps.dtype)).sum(dim=1)


def source_rows(batch: dict, seq2seq: bool) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
    """The batch's sources as generation inputs (ids, mask: right-padded for seq2seq, left-padded
    for a causal model, as the batch holds them) and as unpadded token-id lists."""
    width = batch["input_ids"].shape[1] - (0 if seq2seq else batch["target_ids"].shape[1])
    ids, mask = batch["input_ids"][:, :width], batch["attention_mask"][:, :width]
    # One read of the device (each waits for it): padding marked −1, never a token id.
    rows = [[token for token in row if token >= 0] for row in torch.where(mask.bool(), ids, -1).tolist()]
    return ids, mask, rows


@contextmanager
def plain_index_copy():
    """torch's deterministic algorithms off for a sampling, and back as they were after it.

    The train stage's Trainer turns them on (`deterministic`), and under them a static cache's
    `index_copy_` of each new token's keys and values runs as a sorting index_put, eagerly and,
    as inductor's fallback, in compiled code too. In the H200 operator table of an RLOO step
    (reports/bench/traces/nvidia-h200/rloo.txt) its 2,881 calls took 859 ms of host time, with
    sorts, bounds checks and asserts on the GPU beside them. The cache writes each position once,
    so the plain kernel writes the same values (a test samples both ways); none of the decoding's
    other operators is one that the setting swaps (top-k, top-p and the repetition penalty, which
    scatter, are off). The generate stage runs without them too."""
    enabled, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(False)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


@contextmanager
def stop_at_max_length(max_length: int):
    """transformers' decoding loop, stopped at `max_length` tokens only: no host read per token.

    Its loop asks after each token whether every sequence has ended (`StopCheck`), reading a
    device value: the host waits for the device, every token, and queues nothing ahead. With
    several processes on one GPU, which it runs in turns, each such wait can last until the turn
    comes back to this process: a sampling waits that long about max_new_tokens times.
    transformers defers that read a step on Apple's GPUs only (`DeferredStopCheck`, which also
    needs a cache it can crop, not the static one) and has no option for it, so the loop's check
    is swapped for one that counts tokens for the length of the call. Samples past their end token
    get padding, as before: the same samples, after up to max_new_tokens − 1 extra steps where
    every sample ends early."""
    library = generation_utils.StopCheck

    class AtMaxLength(library):
        def __call__(self, unfinished_sequences: torch.Tensor, tokens: torch.Tensor, length: int) -> bool:
            if self.streamer is not None:  # (a streamer needs the tokens on the host anyway)
                return super().__call__(unfinished_sequences, tokens, length) or length >= max_length
            return length >= max_length

    generation_utils.StopCheck = AtMaxLength
    try:
        yield
    finally:
        generation_utils.StopCheck = library


def static_cache_length(seq2seq: bool, max_input_tokens: int, max_new_tokens: int, multiple: int | None = None) -> int:
    """The positions a static KV cache needs for any batch: a causal model's longest source (padded
    to `multiple`, the length buckets) and its new tokens; a seq2seq decoder's start token and its
    new tokens (the cross-attention's cache has each batch's encoder length, `StaticCaches`: a
    shape that length buckets bound)."""
    source = 0 if seq2seq else -(-max_input_tokens // (multiple or 1)) * (multiple or 1)
    return source + max_new_tokens + 1


class StaticCaches:
    """Static KV caches of `max_cache_len` positions (`static_cache_length`), one per row count (and,
    for a seq2seq model, encoder length), kept for the run and emptied before each use.

    transformers makes a new static cache in each `generate` call. Between two RLOO samplings the
    training step can take the memory the last one freed, and a new cache then lies elsewhere.
    Inductor's CUDA graph trees read a static cache's tensors (`mark_static_address`) at the
    addresses they recorded, so they would record the decoding step again at every sampling, and
    torch releases that count those re-recordings stop replaying graphs after
    `cudagraph_unexpected_rerecord_limit` (128). A kept cache keeps its addresses: the step
    recorded once replays at every sampling. transformers has no option for this; passing a cache
    of one's own to `generate` is its way."""

    def __init__(self, max_cache_len: int):
        self.max_cache_len = max_cache_len
        self.caches: dict[tuple, StaticCache | EncoderDecoderCache] = {}

    def get(self, model: PreTrainedModel, rows: int, encoder_length: int | None = None) -> StaticCache | EncoderDecoderCache:
        """The cache for `rows` rows of `model` (a seq2seq model's: with its cross-attention cache of
        `encoder_length` positions), empty."""
        key = (rows, encoder_length, model.dtype, model.device)
        cache = self.caches.get(key)
        if cache is not None:
            cache.reset()
            return cache
        decoder = model.config.get_text_config(decoder=True)
        cache = StaticCache(config=decoder, max_cache_len=self.max_cache_len)  # (allocated at its first keys)
        if encoder_length is not None:
            cache = EncoderDecoderCache(cache, StaticCache(config=decoder, max_cache_len=encoder_length))
        self.caches[key] = cache
        return cache


def transformers_compiles(device: torch.device, compile_config: CompileConfig | None) -> bool:
    """Whether transformers' `generate` compiles a static cache's decoding step on `device`: the
    devices its `_valid_auto_compile_criteria` names, or any with the config's own switch."""
    return device.type in ("cuda", "xpu", "neuron", "tpu") or bool(getattr(compile_config, "_compile_all_devices", False))


def shared_prefix(generator: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor, count: int) -> DynamicCache:
    """A causal model's keys and values of each left-padded source but its last token, computed
    once a source and repeated for its `count` samples (rows instance-major, as `generate`'s
    num_return_sequences repeats them): the dynamic cache from which `generate`, given the
    repeated sources, reads only their last token before it samples. transformers repeats the
    sources before their forward, so each is read `count` times; an encoder-decoder's encoder it
    runs once. With `params/gpu.yaml`'s sources on a 2-core CPU that forward was a third of a
    sampling's time. The body reads them as `shared_source_logits` reads sources (no output
    projection: no logits are needed), with the positions `generate` gives a left-padded row.
    Ours: transformers reuses a cache that is passed to it (prefix caching) but has no option to
    share one prompt's among its return sequences."""
    cache = DynamicCache(config=generator.config.get_text_config(decoder=True))  # (as `generate` makes its own)
    generator.base_model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=position_ids(mask[:, :-1]),
                         past_key_values=cache, use_cache=True)
    cache.batch_repeat_interleave(count)
    return cache


def sample(generator: PreTrainedModel, batch: dict, count: int, seed: int, max_new_tokens: int, temperature: float,
           eos_id: int, pad_id: int, greedy: bool = False, *, caches: StaticCaches | None = None,
           compile_config: CompileConfig | None = None, early_stop: bool = True
           ) -> tuple[list[list[int]], list[bool], list[list[int]]]:
    """`count` completions of each source of the batch (instance-major: rows b·count .. b·count+count−1
    are instance b's), whether each ended, and each one's source ids: `sample_tokens`, read."""
    new, sources = sample_tokens(generator, batch, count, seed, max_new_tokens, temperature, eos_id, pad_id, greedy,
                                 caches=caches, compile_config=compile_config, early_stop=early_stop)
    return *completion_ids(new, eos_id), sources


def sample_tokens(generator: PreTrainedModel, batch: dict, count: int, seed: int, max_new_tokens: int,
                  temperature: float, eos_id: int, pad_id: int, greedy: bool = False, *,
                  caches: StaticCaches | None = None, compile_config: CompileConfig | None = None,
                  early_stop: bool = True) -> tuple[torch.Tensor, list[list[int]]]:
    """The new tokens of `count` samples of each source of the batch (rows instance-major, on the
    generator's device, not yet read: with `early_stop` False, the decoding may still be running
    there) and each row's source ids. Plain ancestral sampling at
    `temperature` (`greedy`: the argmax decode, `count` 1), in eval and inference mode, without
    autocast, from the global generator seeded with `seed` (forked: the caller's random state is
    left as it was).

    `caches`: the static KV cache of the batch's row count from those, the same size for every
    call, so that the decoding step keeps one shape (and one set of cache tensors) per row count;
    on a GPU transformers then compiles that step (`compile_config`, default: inductor's
    reduce-overhead, CUDA graphs; given only where it compiles, `transformers_compiles`).
    None: the dynamic cache, eager; a causal model's sources then fill it once for their `count`
    samples (`shared_prefix`). `early_stop` False: always
    `max_new_tokens` decoding steps, without a host read per token (`stop_at_max_length`)."""
    seq2seq = bool(generator.config.is_encoder_decoder)
    ids, mask, rows = source_rows(batch, seq2seq)
    # The dynamic cache of a causal model's sources, filled once for their samples: `generate` is
    # then given the sources repeated, one return sequence each (the same rows, in the same order).
    # Not for the few models whose own cache is of another kind (transformers' check: RWKV, xLSTM).
    prefilled = (caches is None and not seq2seq and count > 1 and ids.shape[1] > 1
                 and getattr(generator, "_supports_default_dynamic_cache", lambda: False)())
    options = GenerationConfig(
        do_sample=not greedy, num_beams=1, num_return_sequences=1 if prefilled else count, max_new_tokens=max_new_tokens,
        min_length=0,
        temperature=temperature if not greedy else None, top_k=0 if not greedy else None, top_p=1.0 if not greedy else None,
        repetition_penalty=1.0, no_repeat_ngram_size=0, eos_token_id=eos_id, pad_token_id=pad_id,
        decoder_start_token_id=generator.config.decoder_start_token_id if seq2seq else None,
        # (given only where transformers compiles: elsewhere it warns that it will not)
        **({"compile_config": compile_config}
           if caches is not None and compile_config is not None and transformers_compiles(ids.device, compile_config) else {}))
    was_training = generator.training
    generator.eval()
    devices = [ids.device] if ids.is_cuda else []
    try:
        # Outside the step's autocast: the weights as they are (float32 under bf16-mixed). Under
        # autocast a static cache, typed by the first keys (float32 after the rotary embedding),
        # cannot take the bfloat16 values; the dynamic cache samples the same outside it.
        # Inference mode, as Lightning validates: a compiled decoding step is then not compiled
        # again for the grad mode of a training step (only the token ids leave, as lists).
        with (torch.inference_mode(), torch.autocast(ids.device.type, enabled=False), torch.random.fork_rng(devices=devices),
              plain_decoding(generator), plain_index_copy(),
              nullcontext() if early_stop else stop_at_max_length((1 if seq2seq else ids.shape[1]) + max_new_tokens)):
            cache = {} if caches is None else {
                "past_key_values": caches.get(generator, len(ids) * count, ids.shape[1] if seq2seq else None)}
            inputs = {"input_ids": ids, "attention_mask": mask}
            if prefilled:
                cache = {"past_key_values": shared_prefix(generator, ids, mask, count)}
                inputs = {name: value.repeat_interleave(count, dim=0) for name, value in inputs.items()}
            torch.manual_seed(seed)
            output = generator.generate(**inputs, generation_config=options, **cache)
    finally:
        generator.train(was_training)
    new = generated_tokens(output, ids, seq2seq)
    return new, [row for row in rows for _ in range(count)]


class Sampling:
    """How a run samples (`sample_tokens`): with its static caches (`rl.cache: static`), or with the
    dynamic cache (None). Where compiling the decoding step fails (torch's dynamo, or its compiler
    backend, raising: say inductor on a GPU or with a compiler it cannot use), the run goes on with
    the dynamic cache: the sampling is drawn again from its seed, so the samples are the same, only
    eager. It says why once on stderr, and `static_cache` (1 while the static caches sample)
    falls to 0 in the curves. Our own: transformers has no fallback, and torch's
    (`torch._dynamo.config.suppress_errors`) is set for the whole process, the training step's
    compile included.

    A compile can also do nothing without raising: transformers compiles only where it judges it
    can, and torch runs a frame eagerly once its guards fail too often. `decoding_graphs` counts
    the graphs torch compiled during the run's samplings (the decoding step's: 1 where it compiled
    as planned), and where transformers would compile (`transformers_compiles`: a GPU, or a compile
    config for every device) a first sampling that compiled none says so once on stderr, and
    whether torch.compile was entered at all (dynamo's frame count): the decoding then runs a
    kernel launch per operator, which a step's time shows and nothing else."""

    # transformers' own compile (inductor's reduce-overhead: CUDA graphs, one per row count) with
    # the row count symbolic from the first compile. Left to torch's automatic dynamic shapes, the
    # first other row count (training's after the starting validation's) compiles the step a second
    # time; on an H200 a static cache's compile made generation's warm-up 46 s against 5.6 s
    # (reports/bench/nll_throughput-static.json).
    compile_config: CompileConfig | None = CompileConfig(dynamic=True)

    def __init__(self, caches: StaticCaches | None, early_stop: bool, dtype: torch.dtype | None = None):
        self.caches, self.early_stop = caches, early_stop
        self.static = caches is not None  # whether `rl.cache` is static: the curves are logged then alone
        self.graphs, self.checked = 0, False  # graphs compiled while sampling; whether the first sampling was checked
        self.dtype = dtype  # `rl.sample_dtype`: None samples with the generator's weights as they are
        self.copy: PreTrainedModel | None = None  # the generator's copy in `dtype`, made at the first sampling

    def sampler(self, generator: PreTrainedModel) -> PreTrainedModel:
        """The model that samples: the generator itself, or, where `dtype` is not its weights', a
        copy with its parameters in `dtype` (buffers as they are: the rotary frequencies stay
        float32), their values refreshed from the generator's. Made once and refreshed in place,
        so a compiled decoding step's CUDA graphs find the weights where they recorded them. Ours:
        transformers' `generate` samples from the model it is given, in its dtype (TRL's
        generation with vLLM makes such a copy in the inference engine)."""
        if self.dtype is None or generator.dtype == self.dtype:
            return generator
        # Outside inference mode (a Trainer's validation may run in it): the copy is refreshed
        # in place during training, which an inference tensor refuses.
        with torch.inference_mode(False), torch.no_grad():
            if self.copy is None:
                self.copy = copy.deepcopy(generator).eval()
                for module in self.copy.modules():  # (a compiled body's wrapper calls the original's)
                    module._compiled_call_impl = None
                self.copy.__dict__.pop("_compiled_call", None)  # (transformers' compiled decoding step, the same)
                for parameter in self.copy.parameters():  # (tied weights: one parameter, cast once)
                    parameter.requires_grad_(False)
                    parameter.grad = None
                    parameter.data = parameter.data.to(self.dtype)
            else:
                copies, sources = list(self.copy.parameters()), list(generator.parameters())
                torch._foreach_copy_(copies, sources)
        return self.copy

    def compiled(self, generator: PreTrainedModel, batch: dict, count: int, seed: int, max_new_tokens: int,
                 temperature: float, eos_id: int, pad_id: int, greedy: bool) -> tuple[torch.Tensor, list[list[int]]]:
        """`sample_tokens` with the static caches, counting the graphs torch compiled meanwhile."""
        before, frames = compile_counts().get("compiled_graphs", 0), dynamo_frames()
        result = sample_tokens(generator, batch, count, seed, max_new_tokens, temperature, eos_id, pad_id, greedy,
                               caches=self.caches, compile_config=self.compile_config, early_stop=self.early_stop)
        self.graphs += compile_counts().get("compiled_graphs", 0) - before
        if not self.checked:
            self.checked = True
            if self.graphs == 0 and transformers_compiles(generator.device, self.compile_config):
                seen = dynamo_frames() - frames
                why = ("torch.compile was not entered: transformers did not compile it, or dynamo is disabled" if seen == 0 else
                       f"dynamo saw {seen} frame(s) and compiled none; TORCH_LOGS=recompiles,graph_breaks says why")
                print(f"warning: rl.cache static: the first sampling compiled no decoding step ({why}): each new token "
                      "runs eagerly, a kernel launch per operator; the curve decoding_graphs stays 0", file=sys.stderr, flush=True)
        return result

    def tokens(self, generator: PreTrainedModel, batch: dict, count: int, seed: int, max_new_tokens: int, temperature: float,
               eos_id: int, pad_id: int, greedy: bool = False) -> tuple[torch.Tensor, list[list[int]]]:
        """`sample_tokens` with the run's cache, from `sampler(generator)`."""
        arguments = (self.sampler(generator), batch, count, seed, max_new_tokens, temperature, eos_id, pad_id, greedy)
        if self.caches is not None:
            try:
                return self.compiled(*arguments)
            except torch._dynamo.exc.TorchDynamoException as error:
                cause = getattr(error, "inner_exception", None) or error
                why = " ".join(f"{type(cause).__name__}: {cause}".split())
                print(f"warning: rl.cache static: compiling the decoding step failed ({why[:400]}); this run samples with "
                      "the dynamic cache from here on (the same samples, eager)", file=sys.stderr, flush=True)
                self.caches = None  # (its tensors freed)
        return sample_tokens(*arguments, early_stop=self.early_stop)

    def curves(self) -> dict[str, torch.Tensor]:
        """Where `rl.cache` is static: `static_cache`, 1 while its caches sample, 0 once they fell back;
        `decoding_graphs`, the graphs torch compiled while sampling so far."""
        if not self.static:
            return {}
        return {"static_cache": torch.tensor(float(self.caches is not None)), "decoding_graphs": torch.tensor(float(self.graphs))}


def build(context: ObjectiveContext[RLConfig]) -> Loss:
    config = context.settings
    if context.init_dir is None:
        raise ValueError("rloo needs the context's init_dir")
    scorer = LMScorer.from_dir(context.scorer_dir, context.max_input_tokens, context.max_output_tokens)
    tokenizer = load_tokenizer(context.init_dir)
    encoder = Encoder(tokenizer, is_seq2seq(context.init_dir), context.max_input_tokens, context.max_output_tokens,
                      context.pad_to_multiple_of)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    reference = None
    if config.kl_beta > 0:
        reference = load_model(context.init_dir).eval()
        for parameter in reference.parameters():
            parameter.requires_grad_(False)
    needs_original = config.reward != "score"
    sampling = Sampling(StaticCaches(static_cache_length(encoder.seq2seq, context.max_input_tokens, config.max_new_tokens,
                                                         context.pad_to_multiple_of)) if config.cache == "static" else None,
                        config.early_stop, getattr(torch, config.sample_dtype) if config.sample_dtype else None)

    def rewards(completions, sources, targets, originals, logps: Callable[[], torch.Tensor]
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(reward with the KL term, the metric reward alone, the KL): each R, on the CPU, in float64:
        the advantages are small differences of rewards near −10 (float32 would keep 4 digits of them).
        `logps` gives the generator's log π of the completions; it is called only for the KL term."""
        # All of a step's samples in one scorer batch (a GPU's forward takes the time of its
        # launches, whatever its rows); with the original endings too, each completion is read
        # once for both of its targets (LMScorer's shared sources).
        rows = len(completions)
        sets = 2 if needs_original else 1
        endings = [*targets, *originals] if needs_original else targets
        scored = torch.tensor(scorer.score_ids(completions * sets, endings, sets * rows), dtype=torch.float64)
        m_target, m_original = scored[:rows], scored[rows:] if needs_original else None
        metric = combine_rewards(m_target, m_original, config.reward)
        kl = torch.zeros_like(metric)
        if reference is not None:
            with torch.no_grad():
                # One read of both log-probabilities, their difference in float64 on the host: the
                # same number float64 on the device gives, and Apple's MPS has no float64.
                both = torch.stack((logps().detach().float(), sequence_log_probs(
                    reference, encoder, sources, completions, config.temperature).float())).cpu().double()
                kl = both[0] - both[1]
        return metric - config.kl_beta * kl, metric, kl

    def compute(generator: PreTrainedModel, batch: dict, noise_seed: int, validation: bool) -> LossOutput:
        if needs_original and "original_endings" not in batch:
            raise InputError(f"params: `rl.reward` = {config.reward!r} needs the original ending, which this task does "
                             "not have; valid here: score", key="rl.reward")
        size, count = len(batch["ids"]), config.samples
        started = time.perf_counter()
        new, sources = sampling.tokens(generator, batch, count, noise_seed, config.max_new_tokens, config.temperature, eos, pad)
        launched = time.perf_counter()
        completions, ended = completion_ids(new, eos)  # (the read: waits for what the device still decodes)
        finished = time.perf_counter()
        sampled, reading = finished - started, finished - launched
        repeat = lambda texts: [text for text in texts for _ in range(count)]  # noqa: E731
        originals = repeat(batch["original_endings"]) if needs_original else None
        # B·K, with gradient: the loss's; in validation only the KL term reads them (a generator
        # forward of every sample, skipped without a reference model)
        logps = (sequence_log_probs(generator, encoder, sources, completions, config.temperature)
                 if not validation or reference is not None else None)
        reward, metric, kl = (v.view(size, count) for v in rewards(completions, sources, repeat(batch["targets"]),
                                                                    originals, lambda: logps))
        if config.baseline == "greedy":
            greedy_new, greedy_sources = sampling.tokens(generator, batch, 1, noise_seed, config.max_new_tokens,
                                                         config.temperature, eos, pad, greedy=True)
            greedy, _ = completion_ids(greedy_new, eos)

            def greedy_logps() -> torch.Tensor:  # a generator forward, for the KL term alone
                with torch.no_grad():
                    return sequence_log_probs(generator, encoder, greedy_sources, greedy, config.temperature)
            baseline, _, _ = rewards(greedy, greedy_sources, batch["targets"],
                                     batch["original_endings"] if needs_original else None, greedy_logps)
            advantages = reward - baseline.view(size, 1)
        else:
            advantages = leave_one_out_advantages(reward)
        device = generator.device
        if validation:
            loss = -reward.mean().to(device, torch.float32)
            nll = nll_loss(target_logits(generator, batch), batch["target_ids"], batch["target_mask"]).detach()
        else:
            loss, nll = rloo_loss(logps.view(size, count), advantages.to(device, logps.dtype)), None

        def diagnostics() -> dict[str, torch.Tensor]:
            lengths = torch.tensor([len(c) for c in completions], dtype=torch.float32)
            return {"reward_std": reward.std(dim=1).mean(), "kl": kl.mean(),
                    "advantage_abs": advantages.abs().mean(), "completions/mean_length": lengths.mean(),
                    "completions/clipped_ratio": 1 - torch.tensor(ended, dtype=torch.float32).mean(),
                    "sample_seconds": torch.tensor(sampled), "sample_read_seconds": torch.tensor(reading), **sampling.curves()}
        # `reward`: the metric's alone (comparable across kl_beta); the loss's includes the KL term.
        return LossOutput(loss, {"reward": metric.mean().float()}, nll, lambda: {k: v.float() for k, v in diagnostics().items()})
    return Loss(compute, scorer, frozen=(reference,) if reference is not None else ())
