"""Beam search with an n-gram LM and phrase boosting on a synthetic task: train a small TDT model with
``TDTJointLoss`` on noisy utterances whose labels follow a grammar, estimate a token 3-gram LM from the training
transcripts with ``write_arpa``, then transcribe held-out utterances greedily (without and with the
LM) and by beam search with the LM, and boost a rare phrase.

    python examples/beam_lm_transcribe.py [--steps 150] [--device cpu]

The task: each label is a fixed random feature pattern held for 2 to 4 frames, with heavy noise; the next label
is a fixed function of the two before it 85 times in 100 (the grammar), else random. The prediction network sees
one token back (a ``StatelessPredictor`` of context 1), so what the grammar owes to the label two back is what
the 3-gram LM adds.
Reports, on held-out utterances of the training distribution, the token error rates of greedy decoding (without
and with the LM) and of beam search with the LM; on utterances a third of which start with the rare phrase, the
recall of the phrase (its occurrences in the references found in the hypotheses) and the error rate of the others,
without and with boosting it.
"""

from __future__ import annotations

import argparse
import pathlib
import tempfile

import torch

import speechkernels as sk
from speechkernels.bench.common import example_device, positive_int
from speechkernels.decode import write_arpa

LABELS, FEATURES, WIDTH, DURATIONS = 8, 16, 48, [0, 1, 2, 3, 4]
BLANK = LABELS
RARE = [2, 0]  # a pair the grammar makes only at random: the boosted phrase


def utterances(n: int, g: torch.Generator, patterns: torch.Tensor, grammar: torch.Tensor, noise: float, rare=0.0):
    """n utterances of 3 to 8 labels, a share ``rare`` of them starting with the rare phrase: features [n, T, F]
    (zero-padded), frames [n], labels [n, U], lengths [n]."""
    feats, labels = [], []
    for _ in range(n):
        count = int(torch.randint(3, 9, (), generator=g))
        seq = [int(torch.randint(0, LABELS, (), generator=g))]
        if float(torch.rand((), generator=g)) < rare:
            seq = list(RARE)
        while len(seq) < count:
            if float(torch.rand((), generator=g)) < 0.85:
                nxt = int(grammar[seq[-2] if len(seq) > 1 else LABELS - 1, seq[-1]])
            else:
                nxt = int(torch.randint(0, LABELS, (), generator=g))
            seq.append(nxt if nxt != seq[-1] else (nxt + 1) % LABELS)  # never the previous label
        frames = [patterns[c].expand(int(torch.randint(2, 5, (), generator=g)), FEATURES) for c in seq]
        x = torch.cat(frames)
        feats.append(x + noise * torch.randn(x.shape, generator=g))
        labels.append(torch.tensor(seq))
    T = max(f.shape[0] for f in feats)
    x = torch.stack([torch.nn.functional.pad(f, (0, 0, 0, T - f.shape[0])) for f in feats])
    y = torch.nn.utils.rnn.pad_sequence(labels, batch_first=True, padding_value=BLANK)
    return x, torch.tensor([f.shape[0] for f in feats]), y, torch.tensor([len(s) for s in labels])


class Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(FEATURES, WIDTH, 5, padding=2)
        self.proj = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.relu(self.conv(x.transpose(1, 2)).transpose(1, 2)))


def edit_distance(a: list[int], b: list[int]) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def occurrences(seq: list[int], phrase: list[int]) -> int:
    return sum(seq[i : i + len(phrase)] == phrase for i in range(len(seq) - len(phrase) + 1))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=positive_int, default=150)
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when available")
    args = p.parse_args(argv)
    device = example_device(p, args.device)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    patterns = torch.randn(LABELS, FEATURES, generator=g)
    grammar = torch.randint(0, LABELS, (LABELS, LABELS), generator=torch.Generator().manual_seed(5))
    noise = 1.3

    encoder = Encoder().to(device)
    predictor = sk.StatelessPredictor(LABELS + 1, WIDTH, context_size=1, blank=BLANK).to(device)
    joint = sk.TDTJointLoss(WIDTH, WIDTH, WIDTH, LABELS + 1, durations=DURATIONS, blank=BLANK).to(device)
    params = [*encoder.parameters(), *predictor.parameters(), *joint.parameters()]
    opt = torch.optim.Adam(params, lr=3e-3)
    transcripts = []
    for step in range(args.steps):
        x, frames, y, lengths = utterances(32, g, patterns, grammar, noise)
        transcripts += [y[n, : lengths[n]].tolist() for n in range(32)]
        x, frames, y, lengths = (t.to(device) for t in (x, frames, y, lengths))
        loss = joint(encoder(x), predictor(y), y, frames, lengths)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step:3d}  TDT loss {loss.item():.4f}")

    with tempfile.TemporaryDirectory() as tmp:  # the LM of the training transcripts
        path = pathlib.Path(tmp) / "lm.arpa"
        write_arpa(transcripts, LABELS + 1, path, order=3)
        lm = sk.NGramLM.from_arpa(path, LABELS + 1).to(device)
    booster = sk.PhraseBooster([RARE], LABELS + 1, weights=2.0).to(device)

    decoder = sk.TransducerDecoder.from_joint(joint, predictor)

    def decode(x: torch.Tensor, frames: torch.Tensor, how: str, boost: float = 0.0) -> list[list[int]]:
        with torch.no_grad():
            enc = encoder(x.to(device))
            if how.startswith("greedy"):  # "greedy" or "greedy + LM"
                hyp, _ = decoder.greedy(enc, frames, **(dict(lm=lm, lm_weight=0.6) if how.endswith("LM") else {}))
                return [hyp.tokens[n, : hyp.lengths[n]].tolist() for n in range(x.shape[0])]
            fusion = dict(boosting=booster, boosting_weight=boost) if boost else {}
            hyp = decoder.beam_search(enc, frames, 4, lm=lm, lm_weight=0.6, **fusion)
            return [hyp.tokens[n, 0, : hyp.lengths[n, 0]].tolist() for n in range(x.shape[0])]

    def scores(h: list[list[int]], refs: list[list[int]]) -> dict:
        rest = [n for n in range(len(refs)) if occurrences(refs[n], RARE) == 0]
        found = sum(min(occurrences(a, RARE), occurrences(b, RARE)) for a, b in zip(h, refs, strict=True))
        return dict(
            ter=sum(edit_distance(a, b) for a, b in zip(h, refs, strict=True)) / sum(len(r) for r in refs),
            ter_rest=sum(edit_distance(h[n], refs[n]) for n in rest) / sum(len(refs[n]) for n in rest),
            recall=found / max(sum(occurrences(r, RARE) for r in refs), 1),
        )

    # the boosting weight: on a development set, the largest of a few that keeps the others' error rate
    x, frames, y, lengths = utterances(128, g, patterns, grammar, noise, rare=0.3)
    refs = [y[n, : lengths[n]].tolist() for n in range(128)]
    plain = scores(decode(x, frames, "beam"), refs)["ter_rest"]
    weight = 0.25
    for w in (0.5, 1.0, 2.0):
        if scores(decode(x, frames, "beam", w), refs)["ter_rest"] <= plain:
            weight = w
    print(f"boosting weight {weight} (chosen on 128 development utterances)")
    # held-out utterances of the training distribution: greedy against beam search with the LM; then utterances
    # a third of which start with the rare phrase: beam search with the LM, without and with boosting it
    report = {}
    sets = {0.0: (("greedy", 0.0), ("greedy + LM", 0.0), ("beam 4 + LM", 0.0))}
    sets[0.3] = (("beam 4 + LM", 0.0), ("beam 4 + LM + boosting", weight))
    for share, runs in sets.items():
        x, frames, y, lengths = utterances(256, g, patterns, grammar, noise, rare=share)
        refs = [y[n, : lengths[n]].tolist() for n in range(256)]
        for name, boost in runs:
            r = report[(share, name)] = scores(decode(x, frames, name, boost), refs)
            print(
                f"{device.type}: {'rare phrase in 30%' if share else 'in distribution':18s} {name:24s} token "
                f"error rate {100 * r['ter']:5.1f}% ({100 * r['ter_rest']:5.1f}% without the phrase), recall of "
                f"the phrase {100 * r['recall']:5.1f}%"
            )
    return report


if __name__ == "__main__":
    main()
