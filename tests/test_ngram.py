"""The token n-gram LM (speechkernels.decode.ngram): ARPA files of random models against a plain Python scorer of
the ARPA backoff rules, the vocabulary's mappings, refusals."""

from __future__ import annotations

import math
import random

import pytest
import torch

from speechkernels.decode.ngram import NGramLM, parse_arpa


def random_arpa(path, V: int, order: int, seed: int, *, unk: bool = True, drop: int = 0, words=str) -> None:
    """An ARPA file of a random prefix-closed model over tokens 0..V-1 (``drop`` of them without a unigram),
    <s>, </s> and optionally <unk>; random log10 probabilities and backoffs (not normalised: the rules are what
    is tested). ``words``: each token's word."""
    rng = random.Random(seed)
    tokens = list(range(V))
    rng.shuffle(tokens)
    known = [words(t) for t in sorted(tokens[drop:])]
    grams = [{}]
    for w in known + ["<s>", "</s>"] + (["<unk>"] if unk else []):
        grams[0][(w,)] = (-99.0 if w == "<s>" else -rng.uniform(0.1, 3.0), rng.uniform(-1.0, 0.3))
    for _ in range(2, order + 1):
        level = {}
        histories = [g for g in grams[-1] if g[-1] != "</s>"]
        for _ in range(6 * V):
            h = rng.choice(histories)
            w = rng.choice(known + ["</s>"] + (["<unk>"] if unk else []))
            level[(*h, w)] = (-rng.uniform(0.05, 2.0), rng.uniform(-1.0, 0.3))
        grams.append(level)
    with open(path, "w", encoding="utf-8") as f:
        f.write("a comment before the data\n\n\\data\\\n")
        for k, level in enumerate(grams, 1):
            f.write(f"ngram {k}={len(level)}\n")
        for k, level in enumerate(grams, 1):
            f.write(f"\n\\{k}-grams:\n")
            for g, (p, bo) in level.items():
                top = k == order or g[-1] == "</s>"
                f.write(f"{p:.6f}\t{' '.join(g)}" + ("" if top else f"\t{bo:.6f}") + "\n")
        f.write("\n\\end\\\n")


def python_scorer(path):
    """log p(word | history) and log p(</s> | history) by the ARPA rules, from the parsed file (natural log)."""
    order, grams = parse_arpa(path)
    model = {g: v for level in grams for g, v in level.items()}

    def cond(history: tuple[str, ...], w: str) -> float:
        if (w,) not in model:
            w = "<unk>"
        h = tuple(x if (x,) in model else "<unk>" for x in history)[-(order - 1) :] if order > 1 else ()
        total = 0.0
        while True:
            if (*h, w) in model:
                return (total + model[(*h, w)][0]) * math.log(10)
            if not h:
                return -math.inf
            total += model[h][1] if h in model else 0.0
            h = h[1:]

    return cond


@pytest.mark.parametrize("order", [1, 2, 3, 4])
@pytest.mark.parametrize("drop", [0, 2])
def test_scores_follow_the_arpa_rules(tmp_path, order, drop):
    """Random walks from <s>: every next token's score and the end's, state by state, equal the Python scorer's
    on the whole history; tokens without a unigram read as <unk>."""
    V = 9
    path = tmp_path / "lm.arpa"
    random_arpa(path, V, order, seed=order * 10 + drop, drop=drop)
    lm = NGramLM.from_arpa(path, V)
    cond = python_scorer(path)
    rng = random.Random(order)
    for _walk in range(4):
        states = torch.tensor([lm.start])
        history = ("<s>",)
        for _ in range(7):
            logp, nxt = lm.score(states)
            assert logp.shape == nxt.shape == (1, V) and logp.dtype == torch.float32
            want = torch.tensor([cond(history, str(t)) for t in range(V)], dtype=torch.float64)
            torch.testing.assert_close(logp[0].double(), want, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(
                lm.end_scores(states).double(),
                torch.tensor([cond(history, "</s>")], dtype=torch.float64),
                rtol=1e-5,
                atol=1e-5,
            )
            t = rng.randrange(V)
            states, history = nxt[:, t], (*history, str(t))
    assert lm.order == order


def test_a_batch_scores_as_each_state_alone(tmp_path):
    """A batch of states (repeated, the root, the start) scores as each one alone; the tables move devices."""
    path = tmp_path / "lm.arpa"
    random_arpa(path, 11, 3, seed=5)
    lm = NGramLM.from_arpa(path, 11)
    states = torch.tensor([0, lm.start, 3, lm.num_states - 1, 3])
    logp, nxt = lm.score(states)
    for b, s in enumerate(states.tolist()):
        one, one_next = lm.score(torch.tensor([s]))
        assert torch.equal(logp[b], one[0]) and torch.equal(nxt[b], one_next[0])
    moved = lm.to("cpu")
    assert torch.equal(moved.score(states)[0], logp)
    # a view of the states (strided, int32) scores as its contiguous values
    wide = torch.stack([states, states.flip(0)], 1).to(torch.int32)
    assert torch.equal(lm.score(wide[:, 0])[0], logp) and torch.equal(lm.end_scores(wide[:, 0]), lm.end_scores(states))
    for bad, match in (
        (torch.tensor([0, lm.num_states]), rf"states\[1\]={lm.num_states} is outside"),
        (torch.tensor([-1]), r"states\[0\]=-1 is outside"),
        (torch.tensor([0.0]), "states must be an integer tensor"),
    ):
        with pytest.raises(ValueError, match=match):
            lm.score(bad)


def test_token_strings(tmp_path):
    """Words mapped through a list of token strings score as the same model written with token ids."""
    V = 7
    names = [f"tok{t}" for t in range(V)]
    a, b = tmp_path / "ids.arpa", tmp_path / "names.arpa"
    random_arpa(a, V, 3, seed=2)
    random_arpa(b, V, 3, seed=2, words=lambda t: names[t])
    by_id, by_name = NGramLM.from_arpa(a, V), NGramLM.from_arpa(b, V, tokens=names)
    states = torch.arange(min(by_id.num_states, by_name.num_states))
    assert by_id.num_states == by_name.num_states
    walk_a, walk_b = torch.tensor([by_id.start]), torch.tensor([by_name.start])
    for t in (3, 1, 4, 1, 5):
        (pa, na), (pb, nb) = by_id.score(walk_a), by_name.score(walk_b)
        torch.testing.assert_close(pa, pb)
        walk_a, walk_b = na[:, t], nb[:, t]
    assert states.numel() > 0


def test_refusals(tmp_path):
    path = tmp_path / "lm.arpa"
    random_arpa(path, 5, 2, seed=1)
    text = path.read_text()
    with pytest.raises(ValueError, match=r"not a token id in \[0, vocab_size=4\)"):
        NGramLM.from_arpa(path, 4)
    with pytest.raises(ValueError, match="tokens has 2 strings but vocab_size=5"):
        NGramLM.from_arpa(path, 5, tokens=["a", "b"])
    with pytest.raises(ValueError, match="word '0' is not among the tokens"):
        NGramLM.from_arpa(path, 5, tokens=list("abcde"))
    with pytest.raises(ValueError, match="vocab_size must be"):
        NGramLM.from_arpa(path, 0)
    cases = [
        (text.replace("\\end\\", ""), r"no \\end\\"),
        (text.replace("ngram 2=", "ngram 2=1"), r"announces 1\d+ 2-grams"),
        (text.replace("\\2-grams:", "\\3-grams:"), "out of order"),
        (text.replace("\t<s>\t", "\tx\t<s>\t", 1), "a 1-gram line holds"),
        (text.replace("-99.000000", "nan"), "log10 p must be <= 0"),
        (text.replace("-99.000000", "oops"), "not a number"),
    ]
    for bad, match in cases:
        path.write_text(bad)
        with pytest.raises(ValueError, match=match):
            NGramLM.from_arpa(path, 5)
    random_arpa(path, 5, 2, seed=1, unk=False, drop=1)
    lm = NGramLM.from_arpa(path, 5)  # a token without a unigram and no <unk>: KenLM's <unk> of log10 p = -100
    (missing,) = lm.unknown.tolist()
    scores, _ = lm.score(torch.tensor([0]))
    assert scores[0, missing].item() == pytest.approx(-100 * math.log(10), rel=1e-6)
    assert torch.isfinite(scores).all()


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_an_estimated_lm_is_normalised(tmp_path, order):
    """write_arpa's model from token sequences: from every state the next tokens and </s> sum to 1, and a
    continuation seen in the data is more likely than the same token after an unseen history's backoff."""
    from speechkernels.decode.ngram import write_arpa

    rng = random.Random(order)
    seqs = [[rng.randrange(6) for _ in range(rng.randrange(0, 9))] for _ in range(40)] + [[1, 2, 3]] * 5
    write_arpa(seqs, 7, tmp_path / "lm.arpa", order=order, discount=0.4)
    lm = NGramLM.from_arpa(tmp_path / "lm.arpa", 7)
    states = torch.arange(lm.num_states)
    scores, _ = lm.score(states)
    total = torch.logsumexp(torch.cat([scores, lm.end_scores(states)[:, None]], 1), 1)
    assert total.abs().max() < 1e-5
    assert bool((scores[:, 6] > -math.inf).all())  # a token the data never has keeps a unigram
    if order >= 2:
        state = torch.tensor([lm.start])
        for t in (1, 2):
            state = lm.score(state)[1][:, t]
        assert lm.score(state)[0][0, 3] > lm.score(torch.tensor([0]))[0][0, 3]


def test_write_arpa_refusals(tmp_path):
    from speechkernels.decode.ngram import write_arpa

    with pytest.raises(ValueError, match=r"sequences\[1\]\[0\]=9 is outside \[0, vocab_size=5\)"):
        write_arpa([[1], [9]], 5, tmp_path / "x.arpa")
    with pytest.raises(ValueError, match="discount"):
        write_arpa([[1]], 5, tmp_path / "x.arpa", discount=1.0)
    with pytest.raises(ValueError, match="order"):
        write_arpa([[1]], 5, tmp_path / "x.arpa", order=0)
    with pytest.raises(ValueError, match="vocab_size"):
        write_arpa([[1]], 0, tmp_path / "x.arpa")


def test_words_of_any_character_but_ascii_whitespace(tmp_path):
    """Token strings such as NeMo's chr(id + 100) (U+0085 and U+00A0 among them, which str.split takes for
    whitespace): the same model as the file with decimal ids."""
    V = 70
    random_arpa(tmp_path / "ids.arpa", V, 3, seed=4)
    random_arpa(tmp_path / "chars.arpa", V, 3, seed=4, words=lambda t: chr(t + 100))
    ids = NGramLM.from_arpa(tmp_path / "ids.arpa", V)
    chars = NGramLM.from_arpa(tmp_path / "chars.arpa", V, tokens=[chr(t + 100) for t in range(V)])
    states = torch.arange(ids.num_states)
    for a, b in zip(ids.score(states), chars.score(states), strict=True):
        assert torch.equal(a, b)
