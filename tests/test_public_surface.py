"""The package's public surface, pinned: a name added to or dropped from ``speechkernels.__all__`` is a decision
this test records; the version is written in one place."""

from __future__ import annotations

import importlib.metadata
import pathlib
import re

import speechkernels

PUBLIC = {
    "CTCLoss",
    "ctc_loss",
    "ctc_forced_align",
    "ctc_token_spans",
    "TokenSpans",
    "ctc_greedy_decode",
    "Hypotheses",
    "ctc_beam_search",
    "BeamHypotheses",
    "TransducerDecoder",
    "TransducerState",
    "LSTMPredictor",
    "StatelessPredictor",
    "NGramLM",
    "PhraseBooster",
    "RNNTLoss",
    "rnnt_loss",
    "RNNTJointLoss",
    "rnnt_joint_loss",
    "TDTLoss",
    "tdt_loss",
    "TDTJointLoss",
    "tdt_joint_loss",
    "MultiblankRNNTLoss",
    "multiblank_rnnt_loss",
    "MultiblankJointLoss",
    "multiblank_joint_loss",
    "wavenet",
    "__version__",
}


def test_all_is_the_public_surface():
    assert set(speechkernels.__all__) == PUBLIC
    assert len(speechkernels.__all__) == len(PUBLIC), "a name listed twice"
    missing = [name for name in PUBLIC if not hasattr(speechkernels, name)]
    assert not missing, missing


def test_one_version():
    pyproject = (pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert re.search(r'^dynamic = \["version"\]', pyproject, flags=re.M)
    assert not re.search(r'^version = "', pyproject, flags=re.M), "a second version in pyproject.toml"
    assert re.fullmatch(r"\d+\.\d+\.\d+", speechkernels.__version__)
    assert importlib.metadata.version("speechkernels") == speechkernels.__version__


def test_transducer_losses_declare_the_family_options_alike():
    """Every transducer loss declares its options as explicit keywords with the names and defaults of
    ``transducer_options`` (which checks them): the ones each takes."""
    import inspect

    from speechkernels._transducer.options import transducer_options

    shared = {n: p.default for n, p in inspect.signature(transducer_options).parameters.items()}
    without = {
        speechkernels.rnnt_loss: {"sigma"},
        speechkernels.rnnt_joint_loss: {"sigma", "fused_log_softmax"},
        speechkernels.tdt_loss: {"rnnt_type"},
        speechkernels.multiblank_rnnt_loss: {"rnnt_type"},
        speechkernels.tdt_joint_loss: {"fused_log_softmax", "rnnt_type"},
        speechkernels.multiblank_joint_loss: {"fused_log_softmax", "rnnt_type"},
    }
    for loss, absent in without.items():
        params = inspect.signature(loss).parameters
        declared = {n: params[n].default for n in shared if n in params}
        assert set(declared) == set(shared) - absent, loss.__name__
        assert declared == {n: shared[n] for n in declared}, loss.__name__
