"""What the token automata of decoding (``NGramLM``, ``PhraseBooster``) share: tables indexed by state, moved
between devices together, and the check of a batch of states."""

from __future__ import annotations

import copy

import torch


class StateTables:
    """Tensor attributes named by ``TABLES``, the first with one row per state."""

    TABLES: tuple[str, ...] = ()

    @property
    def num_states(self) -> int:
        return getattr(self, self.TABLES[0]).shape[0]

    @property
    def device(self) -> torch.device:
        return getattr(self, self.TABLES[0]).device

    def to(self, device: torch.device | str):
        """A copy with the tables on ``device``."""
        out = copy.copy(self)
        for name in self.TABLES:
            setattr(out, name, getattr(self, name).to(device))
        return out

    def _checked(self, states: torch.Tensor) -> torch.Tensor:
        """``states`` (any integer dtype and layout, on any device) as an int64 vector on the tables' device;
        ValueError naming a state outside [0, num_states)."""
        if not isinstance(states, torch.Tensor) or states.dtype.is_floating_point or states.dtype == torch.bool:
            raise ValueError(f"states must be an integer tensor, got {getattr(states, 'dtype', type(states).__name__)}")
        states = states.reshape(-1).to(self.device, torch.int64)
        bad = (states < 0) | (states >= self.num_states)
        if bad.any():
            i = int(bad.nonzero()[0, 0])
            raise ValueError(f"states[{i}]={int(states[i])} is outside [0, num_states={self.num_states})")
        return states
