"""What the transducer family shares (RNN-T and RNA in ``rnnt``, TDT and multi-blank in ``tdt``, greedy decoding in
``decode``): the argument checks of a loss and the device-side check of its lengths and labels, the loss
reduction, the lattice cells' Triton helpers, the joint's activations and dropout bits. The capabilities are
siblings over this floor: none imports another's internals."""
