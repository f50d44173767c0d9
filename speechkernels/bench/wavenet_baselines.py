"""The PyTorch CUDA-graph baselines of the WaveNet benchmark: the serial-chain proxy with one graph per sample,
and the vocoder's incremental generation with one step captured and replayed per sample (the same samples as
the eager PyTorch path: ``wavenet.generation.incremental_state`` run by ``wavenet.incremental.sample_incremental``)."""

from __future__ import annotations

import torch

from speechkernels.wavenet.generation import incremental_state
from speechkernels.wavenet.proxy.reference import activation_fn


def proxy_graph(w: torch.Tensor, x0: torch.Tensor, activation: str = "tanh"):
    """The PyTorch baseline with one CUDA graph per sample (L matrix products and the copy back); returns a
    function that replays it n times."""
    act = activation_fn(activation)
    w_t = w.float().transpose(1, 2).contiguous()
    x = x0.float().clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside the capture, as CUDA graphs require
        y = x
        for i in range(w_t.shape[0]):
            y = act(y @ w_t[i])
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x
        for i in range(w_t.shape[0]):
            y = act(y @ w_t[i])
        x.copy_(y)

    def run(n):
        for _ in range(n):
            graph.replay()

    return run


@torch.no_grad()
def generate_cuda_graph(
    model,
    cond: torch.Tensor | None,
    n_samples: int,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    speaker: torch.Tensor | None = None,
    batch: int | None = None,
    uniforms: torch.Tensor | None = None,
) -> torch.Tensor:
    """The same samples as the PyTorch path (``sample_incremental``), one step captured in a CUDA graph and
    replayed per sample (CUDA tensors only); [B, n_samples] int64."""
    state = incremental_state(model, cond, n_samples, temperature, generator, speaker, batch, uniforms)
    if not state.prev.is_cuda:
        raise ValueError(f"generate_cuda_graph needs the model on a CUDA device, got {state.prev.device}")
    n_samples, B = state.uniforms.shape
    out = torch.empty(n_samples, B, dtype=torch.long, device=state.prev.device)
    # warm-up step on a side stream (CUDA graphs need it), then rewind
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        state.step()
    torch.cuda.current_stream().wait_stream(side)
    for q in state.queues:
        q.zero_()
    state.prev.fill_(model.start_class())
    state.t.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        t = state.t.clone()  # the step advances state.t
        out.index_copy_(0, t, state.step().unsqueeze(0))
    # capturing recorded the step without running it; the position is still 0
    for _ in range(n_samples):
        graph.replay()
    return out.T.contiguous()
