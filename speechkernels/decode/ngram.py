"""A token n-gram language model from an ARPA file, as tables that score every next token of a batch of states at
once (shallow fusion in beam search and greedy decoding).

A state is a history the model knows: an n-gram of order < N of the file (its backoff weight applies when a next
token has no n-gram from it), or the empty history (the root). From state h, token t scores

    log p(t | h) = log p(h t)                      if the n-gram (h t) is in the file,
                 = backoff(h) + log p(t | h[1:])   else (the root: the unigram of t, or <unk>'s),

and leads to the longest suffix of (h t) that is a state. The tables hold each state's backoff weight and backoff
state (its longest proper suffix that is a state), its n-grams as arcs sorted by token (log-probability and the
state they lead to), and the root's as dense vectors over the V tokens and <unk> (a token without a unigram reads
as <unk>, from every state: KenLM's reading of a word it does not know). ``score`` walks the N - 1 backoff levels
of a batch of states: the root's vector plus the summed backoff weights, then each level's arcs over it, the most
specific last.

Scores are natural logarithms (the file's base-10 values times ln 10), as the acoustic log-probabilities they are
added to. ``</s>`` is no token: ``end_scores`` gives log p(</s> | h), added once at an utterance's end.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence

import torch

from .._args import as_int
from .state_tables import StateTables

LN10 = math.log(10.0)
BOS, EOS, UNK = "<s>", "</s>", "<unk>"
UNK_MISSING_LOG10 = -100.0  # log10 p of <unk> where a file without it leaves tokens without a unigram (KenLM's)


def parse_arpa(path: str | os.PathLike) -> tuple[int, list[dict[tuple[str, ...], tuple[float, float]]]]:
    """(order N, ngrams) of an ARPA file: ngrams[k - 1] maps each k-gram (a tuple of words) to (log10 p, log10
    backoff; 0 where none is given). Raises ValueError naming the line of a malformed file."""
    counts: dict[int, int] = {}
    grams: list[dict[tuple[str, ...], tuple[float, float]]] = []
    section = None  # "data", an order k, or "end"
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            line = raw.strip(" \t\r\n")  # ASCII whitespace only: a word may be any other character
            if not line:
                continue
            where = f"{os.fspath(path)}:{number}"
            if line == "\\data\\":
                section = "data"
                continue
            if line == "\\end\\":
                section = "end"
                break
            heading = re.fullmatch(r"\\(\d+)-grams:", line)
            if heading:
                k = int(heading.group(1))
                if k != len(grams) + 1 or k not in counts:
                    raise ValueError(f"{where}: section {line} out of order or not announced in \\data\\")
                grams.append({})
                section = k
                continue
            if section == "data":
                m = re.fullmatch(r"ngram\s+(\d+)\s*=\s*(\d+)", line)
                if not m:
                    raise ValueError(f"{where}: expected 'ngram K=COUNT' in \\data\\, got {line!r}")
                counts[int(m.group(1))] = int(m.group(2))
                continue
            if not isinstance(section, int):
                if section is None:
                    continue  # text before \data\ (comments)
                raise ValueError(f"{where}: unexpected line {line!r}")
            k = section
            fields = re.split(r"[ \t]+", line)
            if len(fields) not in (k + 1, k + 2):
                raise ValueError(
                    f"{where}: a {k}-gram line holds log10 p, {k} words and an optional backoff, got {line!r}"
                )
            try:
                logp = float(fields[0])
                backoff = float(fields[k + 1]) if len(fields) == k + 2 else 0.0
            except ValueError:
                raise ValueError(f"{where}: not a number in {line!r}") from None
            if math.isnan(logp) or logp > 0 or math.isnan(backoff) or math.isinf(backoff):
                raise ValueError(f"{where}: log10 p must be <= 0 and the backoff finite, got {line!r}")
            grams[k - 1][tuple(fields[1 : k + 1])] = (logp, backoff)
    if section != "end":
        raise ValueError(f"{os.fspath(path)}: no \\end\\ (a truncated ARPA file?)")
    if not grams or sorted(counts) != list(range(1, len(grams) + 1)):
        raise ValueError(f"{os.fspath(path)}: the \\data\\ counts {counts} do not match the sections")
    for k, table in enumerate(grams, 1):
        if len(table) != counts[k]:
            raise ValueError(
                f"{os.fspath(path)}: \\data\\ announces {counts[k]} {k}-grams, the file holds {len(table)}"
            )
    return len(grams), grams


def write_arpa(
    sequences: Sequence[Sequence[int]], vocab_size: int, path: str | os.PathLike, order: int = 3, discount: float = 0.5
) -> None:
    """Estimate a token n-gram LM from token sequences (transcripts) and write it as an ARPA file (tokens as
    decimal ids, ``<s>`` and ``</s>`` around each sequence): add-one unigrams over the V tokens and ``</s>``, then
    each order's n-grams with their counts less ``discount``, the mass taken off a history given to the lower
    orders through its backoff weight (Katz's backoff with absolute discounting: every history's distribution
    sums to 1). Raises ValueError naming a token outside [0, V)."""
    V = as_int(vocab_size, "vocab_size", minimum=1)
    N = as_int(order, "order", minimum=1)
    if not 0.0 < discount < 1.0:
        raise ValueError(f"discount={discount} must be in (0, 1)")
    counts: list[dict[tuple[str, ...], int]] = [{} for _ in range(N)]
    for i, seq in enumerate(sequences):
        words = [BOS]
        for j, t in enumerate(seq):
            if not 0 <= int(t) < V:
                raise ValueError(f"sequences[{i}][{j}]={int(t)} is outside [0, vocab_size={V})")
            words.append(str(int(t)))
        words.append(EOS)
        for k in range(1, N + 1):
            for a in range(len(words) - k + 1):
                g = tuple(words[a : a + k])
                if g != (BOS,):
                    counts[k - 1][g] = counts[k - 1].get(g, 0) + 1
    vocab = [str(t) for t in range(V)] + [EOS]
    total = sum(counts[0].get((w,), 0) for w in vocab)
    probs: list[dict[tuple[str, ...], float]] = [{(w,): (counts[0].get((w,), 0) + 1) / (total + V + 1) for w in vocab}]
    for k in range(2, N + 1):  # the discounted n-grams of each history
        seen = {}
        for g, c in counts[k - 1].items():
            h = g[:-1]
            seen.setdefault(h, []).append((g, c))
        level = {}
        for grams in seen.values():
            n_h = sum(c for _, c in grams)
            for g, c in grams:
                level[g] = (c - discount) / n_h
        probs.append(level)
    backoff: dict[tuple[str, ...], float] = {}

    def prob(g: tuple[str, ...]) -> float:
        """p(g[-1] | g[:-1]) of the backoff model."""
        if len(g) == 1:
            return probs[0][g]
        if g in probs[len(g) - 1]:
            return probs[len(g) - 1][g]
        return backoff.get(g[:-1], 1.0) * prob(g[1:])

    for k in range(2, N + 1):  # each history's backoff weight: the left-over mass over the lower order's
        by_history: dict[tuple[str, ...], list[tuple[str, ...]]] = {}
        for g in probs[k - 1]:
            by_history.setdefault(g[:-1], []).append(g)
        for h, kept in by_history.items():
            left = 1.0 - sum(probs[k - 1][g] for g in kept)
            lower = 1.0 - sum(prob(g[1:]) for g in kept)
            backoff[h] = left / lower if lower > 0 else 1.0
    with open(path, "w", encoding="utf-8") as f:
        f.write("\\data\\\n")
        levels = [{**probs[0], (BOS,): 0.0}] + probs[1:]
        for k, level in enumerate(levels, 1):
            f.write(f"ngram {k}={len(level)}\n")
        for k, level in enumerate(levels, 1):
            f.write(f"\n\\{k}-grams:\n")
            for g, p in sorted(level.items()):
                logp = -99.0 if g == (BOS,) else math.log10(p)
                bo = f"\t{math.log10(backoff[g]):.7f}" if g in backoff and k < N else ""
                f.write(f"{logp:.7f}\t{' '.join(g)}{bo}\n")
        f.write("\n\\end\\\n")


class NGramLM(StateTables):
    """A token n-gram LM (see the module's description): ``score(states)`` -> log p of every next token [B, V] and
    the states they lead to [B, V]; ``end_scores(states)`` -> log p(</s>) [B]; ``start`` is the state after
    ``<s>`` (the root where the file has no ``<s>``).

    Tables (``to(device)`` moves them): ``backoff`` [S] and ``parent`` [S] (each state's backoff weight and
    backoff state; state 0 is the root), ``arc_start`` [S + 1], ``arc_token``, ``arc_logp``, ``arc_next`` (each
    state's n-grams, sorted by token), ``unigram`` [V + 1] and ``unigram_next`` [V + 1] (the root's), ``end`` [S]
    (log p of ``</s>`` from each state), ``unknown`` (the tokens without a unigram, read as <unk>: arcs and
    unigrams take <unk> as token V) and ``depth`` (the most backoff levels below a state, N - 1); for kernels,
    ``chain`` [S, depth + 1] (each state's backoff chain, the state first), ``above`` [S, depth + 1] (the backoff
    weights summed above each level of it) and ``base`` [S] (summed over the whole chain)."""

    TABLES = (
        "backoff",
        "parent",
        "arc_start",
        "arc_token",
        "arc_logp",
        "arc_next",
        "unigram",
        "unigram_next",
        "end",
        "unknown",
        "chain",
        "above",
        "base",
    )

    def __init__(self, order: int, vocab_size: int, tables: dict[str, torch.Tensor], start: int) -> None:
        self.order, self.vocab_size, self.start = order, vocab_size, start
        self.backoff = tables["backoff"]
        self.parent = tables["parent"]
        self.arc_start = tables["arc_start"]
        self.arc_token = tables["arc_token"]
        self.arc_logp = tables["arc_logp"]
        self.arc_next = tables["arc_next"]
        self.unigram = tables["unigram"]
        self.unigram_next = tables["unigram_next"]
        self.end = tables["end"]
        self.unknown = tables["unknown"]
        self.depth = max(order - 1, 0)
        # every state's backoff chain (level 0 the state, then its backoff states down to the root), the backoff
        # weights above each level and their sum over the whole chain, as ``score`` adds them
        chain = [torch.arange(self.num_states, device=self.device)]
        for _ in range(self.depth):
            chain.append(self.parent[chain[-1]])
        bo = [torch.where(c > 0, self.backoff[c], 0.0) for c in chain]
        above = [torch.zeros(self.num_states, device=self.device)]
        for lvl in range(1, len(chain)):
            above.append(above[-1] + bo[lvl - 1])
        self.chain, self.above = torch.stack(chain, 1), torch.stack(above, 1)
        self.base = above[-1] + bo[-1]

    @classmethod
    def from_arpa(cls, path: str | os.PathLike, vocab_size: int, tokens: Sequence[str] | None = None) -> NGramLM:
        """The LM of an ARPA file whose words are token ids in decimal (``tokens`` None) or the strings of
        ``tokens`` (token i is ``tokens[i]``); ``<s>``, ``</s>`` and ``<unk>`` as usual. A token without a unigram
        reads as ``<unk>`` (a file without ``<unk>`` gets one of log10 p = -100, as KenLM reads it: an LM over the
        tokens but the blank loads for a decoder whose classes include it). Raises ValueError naming the word or
        line the vocabulary or the format refuses."""
        V = as_int(vocab_size, "vocab_size", minimum=1)
        if tokens is not None:
            tokens = list(tokens)
            if len(tokens) != V:
                raise ValueError(f"tokens has {len(tokens)} strings but vocab_size={V}")
            if len(set(tokens)) != V:
                raise ValueError("tokens must be distinct strings")
        order, grams = parse_arpa(path)
        ids = {w: i for i, w in enumerate(tokens)} if tokens is not None else None

        def token_of(word: str) -> int | str:
            if word in (BOS, EOS, UNK):
                return word
            if ids is not None:
                if word not in ids:
                    raise ValueError(f"{os.fspath(path)}: word {word!r} is not among the tokens")
                return ids[word]
            if not re.fullmatch(r"\d+", word) or int(word) >= V:
                raise ValueError(f"{os.fspath(path)}: word {word!r} is not a token id in [0, vocab_size={V})")
            return int(word)

        # n-grams over token ids (and the special words), natural log
        model: dict[tuple, tuple[float, float]] = {}
        for table in grams:
            for words, (logp, bo) in table.items():
                key = tuple(token_of(w) for w in words)
                if key in model:
                    raise ValueError(f"{os.fspath(path)}: n-gram {' '.join(words)!r} listed twice")
                model[key] = (logp * LN10, bo * LN10)
        if (UNK,) not in model and any((t,) not in model for t in range(V)):
            model[(UNK,)] = (UNK_MISSING_LOG10 * LN10, 0.0)  # as KenLM adds it to a file without one
        return cls._from_model(order, V, model, path)

    @classmethod
    def _from_model(cls, order: int, V: int, model: dict[tuple, tuple[float, float]], path) -> NGramLM:
        # states: the root and every n-gram of order < N
        keys = [()] + sorted((g for g in model if len(g) < order), key=lambda g: (len(g), [str(w) for w in g]))
        state_of = {g: s for s, g in enumerate(keys)}

        def longest_state(g: tuple) -> int:
            while g not in state_of:
                g = g[1:]
            return state_of[g]

        S = len(keys)
        backoff = torch.zeros(S, dtype=torch.float64)
        parent = torch.zeros(S, dtype=torch.int64)
        end = torch.zeros(S, dtype=torch.float64)
        for s, g in enumerate(keys):
            if s:
                backoff[s] = model[g][1]
                parent[s] = longest_state(g[1:])
        # the arcs over V + 1 tokens: V is <unk>, whose scores the tokens without a unigram take (as KenLM reads
        # a word it does not know)
        arcs: list[list[tuple[int, float, int]]] = [[] for _ in range(S)]
        for g, (logp, _) in model.items():
            t = V if g[-1] == UNK else g[-1]
            if len(g) < 2 or not isinstance(t, int):  # unigrams are the root's; <s> and </s> are no next token
                continue
            h = state_of.get(g[:-1])
            if h is None:  # an n-gram whose history is no n-gram of the file (not prefix-closed): unreachable
                continue
            arcs[h].append((t, logp, longest_state(g[-(order - 1) :])))
        unknown = [t for t in range(V) if (t,) not in model]
        unigram = torch.full((V + 1,), -math.inf, dtype=torch.float64)
        unigram_next = torch.zeros(V + 1, dtype=torch.int64)
        for t, word in [(t, t) for t in range(V) if t not in unknown] + [(V, UNK)] * ((UNK,) in model):
            unigram[t] = model[(word,)][0]
            unigram_next[t] = state_of[(word,)] if order > 1 else 0
        # log p(</s> | h): the n-gram (h </s>) of the longest suffix of h that has one, plus the backoffs above it
        for s, g in enumerate(keys):
            total, h = 0.0, g
            while True:
                hit = model.get((*h, EOS))
                if hit is not None:
                    end[s] = total + hit[0]
                    break
                if not h:
                    end[s] = -math.inf
                    break
                total += model[h][1] if h in model else 0.0
                h = h[1:]
        arc_start = torch.zeros(S + 1, dtype=torch.int64)
        flat = []
        for s in range(S):
            arcs[s].sort()
            flat += arcs[s]
            arc_start[s + 1] = len(flat)
        tables = dict(
            backoff=backoff.float(),
            parent=parent,
            arc_start=arc_start,
            arc_token=torch.tensor([a[0] for a in flat], dtype=torch.int64),
            arc_logp=torch.tensor([a[1] for a in flat], dtype=torch.float32),
            arc_next=torch.tensor([a[2] for a in flat], dtype=torch.int64),
            unigram=unigram.float(),
            unigram_next=unigram_next,
            end=end.float(),
            unknown=torch.tensor(unknown, dtype=torch.int64),
        )
        start = state_of.get((BOS,), 0)
        return cls(order, V, tables, start)

    def score(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(log p [B, V] float32 of every next token, the states they lead to [B, V] int64) from ``states`` [B]
        (any integer dtype and layout, on any device). Raises ValueError naming a state outside [0, num_states)."""
        states = self._checked(states)
        B = states.shape[0]
        # the backoff chain: level 0 the state itself, then its backoff states down to the root
        chain = [states]
        for _ in range(self.depth):
            chain.append(self.parent[chain[-1]])
        # bo_above[l]: the backoff weights of the levels more specific than l (taken on the way down to l)
        bo = [torch.where(c > 0, self.backoff[c], 0.0) for c in chain]
        above = [torch.zeros(B, device=self.device)]
        for lvl in range(1, len(chain)):
            above.append(above[-1] + bo[lvl - 1])
        # the root: every token's unigram below the summed backoffs of the whole chain (the root adds none)
        logp = self.unigram[None, :] + (above[-1] + bo[-1])[:, None]
        nxt = self.unigram_next[None, :].expand(B, -1).clone()
        for lvl in range(len(chain) - 1, -1, -1):  # the most specific level last, overriding the others
            c = chain[lvl]
            lo, hi = self.arc_start[c], self.arc_start[c + 1]
            counts = torch.where(c > 0, hi - lo, 0)
            rows = torch.repeat_interleave(torch.arange(B, device=self.device), counts)
            if rows.numel() == 0:
                continue
            first = torch.cumsum(counts, 0) - counts
            arc = lo[rows] + torch.arange(rows.numel(), device=self.device) - first[rows]
            tok = self.arc_token[arc]
            logp[rows, tok] = self.arc_logp[arc] + above[lvl][rows]
            nxt[rows, tok] = self.arc_next[arc]
        if self.unknown.numel():  # the tokens without a unigram read as <unk> (column V)
            logp[:, self.unknown] = logp[:, -1:].clone()
            nxt[:, self.unknown] = nxt[:, -1:].clone()
        return logp[:, :-1], nxt[:, :-1]

    def end_scores(self, states: torch.Tensor) -> torch.Tensor:
        """log p(</s> | state) [B] float32 (-inf where the file gives </s> no probability)."""
        return self.end[self._checked(states)]
