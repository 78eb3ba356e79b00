"""`Sampler`: a per-sequence llama sampler chain, and a grammar sampler beside it."""

from __future__ import annotations

import ctypes

import llama_cpp as C
import numpy as np

from engine.grammar import LazyTrigger, check_gbnf, word_triggers
from engine.llama.backend import CaptureErrors
from engine.llama.context import Context
from engine.llama.model import Model
from engine.types import SamplingParams

_GRAMMAR_TOP = 256
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


class Sampler:
    """A per-sequence llama sampler chain, and a grammar sampler beside it.

    Built on the caller's thread (grammar compilation may take a while and its errors
    belong to the request), then owned by the engine thread.

    The grammar is not in the chain: checking all 49k candidates against it costs about
    30x a plain sample. As llama.cpp's own sampler does, the chain picks a token first
    and the grammar checks only that one; only when it is rejected does the grammar
    filter the whole vocabulary and the chain pick again.

    No path may make llama.cpp's grammar throw (see engine/grammar.py): every token is
    checked before the grammar accepts it, a lazy grammar's trigger is matched here in
    Python, and when the grammar admits no token `sample` returns None (the generation
    ends: the grammar is complete, or nothing the chain may pick fits it).
    """

    def __init__(self, model: Model, params: SamplingParams, seed: int, n_ctx: int):
        self._keep: list[object] = []  # ctypes arrays the chain may point into
        self.grammar: object | None = None
        self._model = model
        self._n_vocab = model.n_vocab
        self._trigger: LazyTrigger | None = None  # set while a lazy grammar waits
        self._refused = False  # a forced token the grammar did not take: sampling ends
        # The chain is greedy after at most a logit bias (ids, values): see `sample`.
        self._greedy_bias: tuple[np.ndarray, np.ndarray] | None = None
        chain_params = C.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        self.handle = C.llama_sampler_chain_init(chain_params)
        try:
            self._build(model, params, seed, n_ctx)
        except BaseException:
            self.close()
            raise

    def _add(self, sampler: object) -> None:
        if not sampler:
            raise ValueError("llama.cpp rejected a sampler parameter")
        C.llama_sampler_chain_add(self.handle, sampler)

    def _build(self, model: Model, p: SamplingParams, seed: int, n_ctx: int) -> None:
        if p.grammar is not None:
            check_gbnf(p.grammar)
            if p.grammar_lazy:
                patterns, tokens = word_triggers(
                    p.grammar_trigger_words,
                    lambda word: model.tokenize(word, add_special=False, parse_special=True),
                )
                self._trigger = LazyTrigger(
                    (*p.grammar_trigger_patterns, *patterns), (*p.grammar_trigger_tokens, *tokens)
                )
            with CaptureErrors() as errors:
                grammar = C.llama_sampler_init_grammar(model.vocab, p.grammar.encode(), b"root")
            if not grammar:
                reason = "; ".join(e for e in errors if e) or "the grammar does not parse"
                raise ValueError(f"invalid grammar: {reason}")
            self.grammar = grammar
            self._candidates = np.zeros(model.n_vocab, dtype=_TOKEN_DATA)
            self._one = np.zeros(1, dtype=_TOKEN_DATA)
        bias = list(p.logit_bias)
        if p.ignore_eos:
            bias += [(t, float("-inf")) for t in model.eog_ids]
        if bias:
            arr = (C.llama_logit_bias * len(bias))(*(C.llama_logit_bias(t, b) for t, b in bias))
            self._keep.append(arr)
            self._add(C.llama_sampler_init_logit_bias(model.n_vocab, len(bias), arr))
        if p.repeat_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0:
            last_n = n_ctx if p.repeat_last_n == -1 else p.repeat_last_n
            # This build's llama.cpp still takes n_vocab first (five arguments).
            self._add(
                C.llama_sampler_init_penalties(
                    model.n_vocab, last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty
                )
            )
        if p.dry_multiplier > 0.0:
            breakers = [s.encode() for s in p.dry_sequence_breakers]
            arr_b = (ctypes.c_char_p * len(breakers))(*breakers)
            self._keep.append(arr_b)
            self._add(
                C.llama_sampler_init_dry(
                    model.vocab,
                    p.dry_multiplier,
                    p.dry_base,
                    p.dry_allowed_length,
                    n_ctx if p.dry_penalty_last_n == -1 else p.dry_penalty_last_n,
                    arr_b,
                    len(breakers),
                )
            )
        if p.greedy:
            self._add(C.llama_sampler_init_greedy())
            if C.llama_sampler_chain_n(self.handle) == 1 + bool(bias):  # no penalty, no DRY
                valid = [(t, b) for t, b in bias if 0 <= t < model.n_vocab]
                self._greedy_bias = (
                    np.array([t for t, _ in valid], dtype=np.int64),
                    np.array([b for _, b in valid], dtype=np.float32),
                )
            return
        if p.mirostat == 1:
            self._add(C.llama_sampler_init_temp(p.temperature))
            self._add(
                C.llama_sampler_init_mirostat(
                    model.n_vocab, seed, p.mirostat_tau, p.mirostat_eta, 100
                )
            )
            return
        if p.mirostat == 2:
            self._add(C.llama_sampler_init_temp(p.temperature))
            self._add(C.llama_sampler_init_mirostat_v2(seed, p.mirostat_tau, p.mirostat_eta))
            return
        min_keep = p.min_keep
        if p.top_n_sigma > 0.0:
            self._add(C.llama_sampler_init_top_n_sigma(p.top_n_sigma))
        if p.top_k > 0:
            self._add(C.llama_sampler_init_top_k(p.top_k))
        if p.typical_p < 1.0:
            self._add(C.llama_sampler_init_typical(p.typical_p, min_keep))
        if p.top_p < 1.0:
            self._add(C.llama_sampler_init_top_p(p.top_p, min_keep))
        if p.min_p > 0.0:
            self._add(C.llama_sampler_init_min_p(p.min_p, min_keep))
        if p.xtc_probability > 0.0:
            self._add(C.llama_sampler_init_xtc(p.xtc_probability, p.xtc_threshold, min_keep, seed))
        if p.dynatemp_range > 0.0:
            self._add(
                C.llama_sampler_init_temp_ext(p.temperature, p.dynatemp_range, p.dynatemp_exponent)
            )
        else:
            self._add(C.llama_sampler_init_temp(p.temperature))
        self._add(C.llama_sampler_init_dist(seed))

    def sample(self, ctx: Context, row: int) -> int | None:
        """Sample from batch row `row` and accept the token into the chain's state.
        None: the grammar admits no token the chain may pick; the generation ends."""
        if self._refused:
            return None
        if self.grammar is None:
            if self._greedy_bias is not None:
                return self._greedy(ctx.logits_row(row), *self._greedy_bias)
            return int(C.llama_sampler_sample(self.handle, ctx.handle, row))
        logits = ctx.logits_row(row)
        token = self._pick(logits, constrained=False)
        if self._trigger is not None:  # a lazy grammar, not triggered yet
            if not self._watch(token):
                return None
        elif not self._allows(token):  # rejected: filter everything, pick again
            token = self._pick(logits, constrained=True)
            if not self._allows(token):
                return None
            self._accept(token)
        else:
            self._accept(token)
        C.llama_sampler_accept(self.handle, token)
        return token

    @staticmethod
    def _greedy(logits: np.ndarray, ids: np.ndarray, bias: np.ndarray) -> int:
        """What a chain of a logit bias and the greedy sampler picks (the first highest
        biased logit), without llama_sampler_sample's copy of every logit into a
        candidate array. Neither sampler keeps state to accept a token into.

        The bias goes onto llama.cpp's row in place and is taken back after the argmax:
        the row is read again for logprobs, and copying all of it would cost more than
        the argmax itself."""
        if not len(ids):
            return int(logits.argmax())
        kept = logits[ids]
        np.add.at(logits, ids, bias)  # a token listed twice gets both, as in llama.cpp
        try:
            return int(logits.argmax())
        finally:
            logits[ids] = kept

    @property
    def constraining(self) -> bool:
        """The grammar decides the next tokens (a lazy one once triggered)."""
        return self.grammar is not None and self._trigger is None

    def force(self, tokens: tuple[int, ...]) -> None:
        """Take tokens the engine appended as if they had been sampled (a thinking
        block's close, engine/thinking.py): the chain's penalties count them, a waiting
        lazy grammar's trigger reads them, an active grammar must allow each. The engine
        forces nothing while the grammar constrains; should a forced token still be
        refused (a trigger it fired), sampling ends as when the grammar admits nothing."""
        for token in tokens:
            if self.grammar is not None:
                if self._trigger is not None:
                    allowed = self._watch(token)
                else:
                    allowed = self._allows(token)
                    if allowed:
                        self._accept(token)
                if not allowed:
                    self._refused = True
                    return
            C.llama_sampler_accept(self.handle, token)

    def _allows(self, token: int) -> bool:
        one = self._one
        one[0] = (token, 0.0, 0.0)
        self._apply(self.grammar, one)
        return bool(np.isfinite(one[0]["logit"]))

    def _accept(self, token: int) -> None:
        # An end-of-generation token ends the sequence: the grammar needs no update
        # (and llama.cpp aborts on one it does not allow).
        if token not in self._model.eog_ids:
            C.llama_sampler_accept(self.grammar, token)

    def _watch(self, token: int) -> bool:
        """Free sampling until the trigger fires; then the grammar must accept the
        triggered text, or the generation ends (False)."""
        trigger = self._trigger
        assert trigger is not None
        if token in trigger.tokens:
            self._trigger = None
            if not self._allows(token):
                return False
            self._accept(token)
            return True
        if token in self._model.eog_ids:
            return True
        text = trigger.feed(self._model.special_piece(token))
        if text is None:
            return True
        self._trigger = None
        return self._feed(text)

    def _feed(self, text: bytes) -> bool:
        """Accept `text` into the grammar one byte token at a time, each checked."""
        for byte in text:
            token = self._model.byte_tokens.get(byte)
            if token is None or not self._allows(token):
                return False
            C.llama_sampler_accept(self.grammar, token)
        return True

    def _pick(self, logits: np.ndarray, *, constrained: bool) -> int:
        if constrained:
            # The grammar first filters the most likely tokens only; the whole
            # vocabulary (about 60 ms) only when none of those is allowed. Tokens
            # beyond the top few hundred carry next to no probability mass.
            top = np.argpartition(logits, -_GRAMMAR_TOP)[-_GRAMMAR_TOP:].astype(np.int32)
            few = np.zeros(len(top), dtype=_TOKEN_DATA)
            few["id"], few["logit"] = top, logits[top]
            self._apply(self.grammar, few)
            if np.isfinite(few["logit"]).any():
                return int(few[self._apply(self.handle, few)]["id"])
        cur = self._candidates
        cur["id"] = np.arange(self._n_vocab, dtype=np.int32)
        cur["logit"] = logits
        cur["p"] = 0.0
        if constrained:
            self._apply(self.grammar, cur)
        selected = self._apply(self.handle, cur)
        return int(cur[selected]["id"])

    @staticmethod
    def _apply(sampler: object, arr: np.ndarray) -> int:
        data = C.llama_token_data_array(
            data=arr.ctypes.data_as(ctypes.POINTER(C.llama_token_data)),
            size=len(arr),
            selected=-1,
            sorted=False,
        )
        C.llama_sampler_apply(sampler, ctypes.byref(data))
        return int(data.selected)

    def close(self) -> None:
        if self.handle:
            C.llama_sampler_free(self.handle)
            self.handle = None
        if self.grammar:
            C.llama_sampler_free(self.grammar)
            self.grammar = None
        self._keep.clear()

    def __del__(self) -> None:  # a request dropped before it reached the engine thread
        self.close()
