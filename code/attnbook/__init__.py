"""attnbook: the shared code of the runnable textbook *Attention, Masked and Unmasked*.

One module per concept (see the chapter → module table in the repository's README):

- :mod:`attnbook.masking`  -- masks and masked softmax (chapter "Attention as soft dictionary lookup").
- :mod:`attnbook.kernels`  -- Nadaraya–Watson kernel regression (chapter "Kernel regression as attention").
- :mod:`attnbook.attention` -- scaled dot-product, additive, cosine and multi-head attention (chapter "Parametric
  attention"); the initialization experiment on MNIST (:mod:`attnbook.data.mnist`) in
  :mod:`attnbook.experiments.init_scale`.
- :mod:`attnbook.text` -- tokenizer, vocabulary and padding (chapter "Sequence to sequence with attention").
- :mod:`attnbook.seq2seq` -- GRU encoder-decoder with pluggable attention, greedy decoding and beam search
  (chapter "Sequence to sequence with attention"); data in :mod:`attnbook.data.translation`, the experiment and
  its CLI in :mod:`attnbook.experiments.seq2seq`.
- :mod:`attnbook.pooling`, :mod:`attnbook.models`, :mod:`attnbook.batching`, :mod:`attnbook.stats` -- attention
  pooling with four padding treatments, the BiGRU classifier and HAN, length bucketing, and paired-seed statistics
  (chapter "Seq2vec attention and the padding-mask experiments"); the experiment grid and its resumable CLI in
  :mod:`attnbook.experiments.masking`.
- :mod:`attnbook.nli` -- the decomposable attention model, masked on both sides (chapter "Natural language inference
  with the decomposable attention model"); data (generated natural-logic pairs, SNLI) in :mod:`attnbook.data.nli`,
  the experiments and their CLI in :mod:`attnbook.experiments.nli`.
- :mod:`attnbook.hard_attention` -- REINFORCE with a baseline, straight-through Gumbel-softmax, and a digit captioner
  with soft, hard and Gumbel attention (chapter "Soft and hard attention"); data in :mod:`attnbook.data.digits`, the
  experiment and its CLI in :mod:`attnbook.experiments.hard_attention`.
- :mod:`attnbook.interpret` -- importance measures, Kendall's tau, the permutation test and uniform attention (chapter
  "Soft and hard attention", section "Is attention an explanation?"), run on chapter 5's classifier by
  :mod:`attnbook.experiments.attention_explanation`; reviews in :mod:`attnbook.data.reviews`.
- :mod:`attnbook.transformer` -- positional encodings, Transformer layers, a translation model and an encoder
  classifier (chapter "Self-attention and the Transformer").
- :mod:`attnbook.packing` -- attention over packed rows with a dense document mask, FlexAttention and variable-length
  kernels; the packing itself (:func:`attnbook.batching.pack_documents`, document masks and positions) in
  :mod:`attnbook.batching`, the experiment and its CLI in :mod:`attnbook.experiments.packing` (chapter 9, section
  "Packing instead of padding").
- :mod:`attnbook.runtime`  -- run mode (quick/full), device, seeding, glue and wall time.
- :mod:`attnbook.plotting` -- the book's plot style and token-labelled attention heatmaps.
- :mod:`attnbook.provenance` -- where and how a stored result was produced.

Chapters import the submodule they teach, e.g. ``from attnbook.masking import masked_softmax``.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
