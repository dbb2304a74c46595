"""attnbook: the shared code of the runnable textbook *Attention, Masked and Unmasked*.

One module per concept (see the chapter → module table in the repository's README):

- :mod:`attnbook.masking`  -- masks and masked softmax (chapter "Attention as soft dictionary lookup").
- :mod:`attnbook.kernels`  -- Nadaraya–Watson kernel regression (chapter "Kernel regression as attention").
- :mod:`attnbook.attention` -- scaled dot-product, additive, cosine and multi-head attention (chapter "Parametric
  attention").
- :mod:`attnbook.runtime`  -- run mode (quick/full), device, seeding, glue and wall time.
- :mod:`attnbook.plotting` -- the book's plot style and token-labelled attention heatmaps.
- :mod:`attnbook.provenance` -- where and how a stored result was produced.

Chapters import the submodule they teach, e.g. ``from attnbook.masking import masked_softmax``.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
