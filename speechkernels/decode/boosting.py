"""Phrase boosting (contextual biasing) over token sequences: an Aho-Corasick automaton of the phrases whose
partial matches earn a provisional bonus that is taken back when the match is abandoned.

A trie of the phrases: each node is a token prefix of some phrase, with ``node_score`` the sum of its tokens'
bonuses (a phrase's bonus per token is its weight; where phrases share a prefix, each shared token takes the
largest of their weights). Failure links make it an automaton over every token sequence: from a node, a token
leads to the longest suffix of (node's tokens + token) that is a trie node (the root when none is). A step from
state s to s' by a token adds ``node_score[s'] - node_score[s]`` (a partial match grows: its token's bonus; it
breaks: the bonus of what is abandoned is taken back) plus ``output_score[s']``: the full bonus of every phrase
that ends there (the node's own and those that are its suffixes), kept for good; in float32 as
``gain[s'] - node_score[s]``, ``gain = node_score + output_score``. At the end of an utterance
``end_scores`` takes back the pending partial match. So a hypothesis ends with exactly the bonuses of the phrase
occurrences it contains, and a boosted phrase is paid for one token at a time: no token earns more than its own
bonus until the phrase completes.

Tables (``to(device)`` moves them): ``next`` [S, V] int64 (the transition of every state by every token, failure
links resolved), ``node_score`` [S], ``output_score`` [S] and ``gain`` [S] float32, and ``gain_next`` [S, V]
float32 (``gain[next]``: what each token earns from each state before the state's ``node_score`` is taken back);
state 0 is the root; ``fail`` [S] (each state's failure state); ``max_depth`` is the longest phrase's length.
``step(states)`` gives the bonus of every next token [B, V] and the states they lead to, as ``NGramLM.score``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .state_tables import StateTables


class PhraseBooster(StateTables):
    """Boosting of token phrases (see the module's description).

    Args:
        phrases: the phrases, each a non-empty sequence of token ids in [0, vocab_size).
        vocab_size: V, the tokens a decoder emits (the blank included where it is a class; it never steps).
        weights: the bonus per token of every phrase (a number), or one per phrase; each positive and finite.

    Raises:
        ValueError: an empty phrase, a token outside [0, V), a weight that is not positive and finite, or a count
            of weights that is not the phrases', naming the phrase (and token).

    Example:
        >>> booster = PhraseBooster([[5, 9, 2], [5, 7]], vocab_size=32, weights=2.0)
        >>> bonus, states = booster.step(torch.tensor([booster.start]))  # [1, 32] each
    """

    TABLES = ("node_score", "next", "output_score", "gain", "gain_next", "fail")

    def __init__(self, phrases: Sequence[Sequence[int]], vocab_size: int, weights: float | Sequence[float] = 1.0):
        V = int(vocab_size)
        if V < 1:
            raise ValueError(f"vocab_size must be at least 1, got {vocab_size}")
        phrases = [[int(t) for t in p] for p in phrases]
        if isinstance(weights, (int, float)):
            weights = [float(weights)] * len(phrases)
        weights = [float(w) for w in weights]
        if len(weights) != len(phrases):
            raise ValueError(f"weights has {len(weights)} values for {len(phrases)} phrases")
        children: list[dict[int, int]] = [{}]
        token_score, is_end = [0.0], [False]
        for i, (p, w) in enumerate(zip(phrases, weights, strict=True)):
            if not p:
                raise ValueError(f"phrases[{i}] is empty")
            if not (w > 0 and w != float("inf")):
                raise ValueError(f"weights[{i}]={w} must be positive and finite")
            node = 0
            for j, t in enumerate(p):
                if not 0 <= t < V:
                    raise ValueError(f"phrases[{i}][{j}]={t} is outside [0, vocab_size={V})")
                if t not in children[node]:
                    children[node][t] = len(children)
                    children.append({})
                    token_score.append(w)
                    is_end.append(False)
                node = children[node][t]
                token_score[node] = max(token_score[node], w)
            is_end[node] = True
        S = len(children)
        # breadth first: a node's failure state (a proper suffix: shallower) is done before it
        node_score, output_score = [0.0] * S, [0.0] * S
        fail, nxt = [0] * S, [[]] * S
        order = [0]
        for s in order:
            if s == 0:
                row = [0] * V
            else:
                row = list(nxt[fail[s]])  # what s lacks, its longest proper suffix's transitions give
                output_score[s] = (node_score[s] if is_end[s] else 0.0) + output_score[fail[s]]
            for t, child in sorted(children[s].items()):
                node_score[child] = node_score[s] + token_score[child]
                fail[child] = 0 if s == 0 else row[t]
                row[t] = child
                order.append(child)
            nxt[s] = row
        self.vocab_size, self.start = V, 0
        self.max_depth = max((len(p) for p in phrases), default=0)
        self.fail = torch.tensor(fail, dtype=torch.int64)
        self.next = torch.tensor(nxt, dtype=torch.int64)
        self.node_score = torch.tensor(node_score, dtype=torch.float32)
        self.output_score = torch.tensor(output_score, dtype=torch.float32)
        self.gain = self.node_score + self.output_score  # what entering a state earns (before leaving the last)
        self.gain_next = self.gain[self.next]

    def step(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the bonus [B, V] float32 of every next token, the states they lead to [B, V] int64) from ``states``
        [B] (any integer dtype and layout, on any device). Raises ValueError naming a state outside [0,
        num_states)."""
        states = self._checked(states)
        bonus = self.gain_next[states] - self.node_score[states][:, None]
        return bonus, self.next[states]

    def end_scores(self, states: torch.Tensor) -> torch.Tensor:
        """The pending partial match taken back at the end of an utterance: -node_score [B] float32."""
        return -self.node_score[self._checked(states)]
