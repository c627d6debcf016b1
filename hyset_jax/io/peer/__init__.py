"""Models to and from the HYSET authors' PyTorch implementation (``hyset export --format
hyset-pytorch``, ``hyset import --from hyset-pytorch``; docs/export.md).

- :mod:`hyset_jax.io.peer.torch_format`: read and write ``torch.save`` zip checkpoints without
  torch, through a pickle reader that admits tensors and plain containers only.
- :mod:`hyset_jax.io.peer.convert`: the authors' checkpoint payload (format_version 2) from a
  model directory and back, with what their scorer does on load.
"""
