"""The course's models and their data for live training: ``build_task`` makes a seeded ``Task``.

Models and data (made here, seeded, nothing downloaded)
--------------------------------------------------------
* ``"mlp"``: a multilayer perceptron (``depth`` ``nn.Linear`` layers, ReLU between them, torch's
  default initialisation) classifying Gaussian inputs into 10 classes given by a fixed random linear
  teacher; a fresh batch every step.
* ``"transformer"``: token embedding plus a learned position embedding, an ``nn.TransformerEncoder``
  (``batch_first=True``, post-norm, no dropout), a mean over the real (unpadded) positions and a
  linear head. Each sequence has its own length and is right-padded with token 0; the padding is
  passed as ``src_key_padding_mask``. The task: which of the tokens 1 ... 9 occurs most often in the
  sequence (the smallest of them on a tie; nine classes).
* ``"beam"``: a regression whose gradients are small for a reason (``ampviz.training.beam``): a residual
  MLP with LayerNorm predicts the deflection, in metres, of simply supported beams under two point
  loads, trained with Adam on a mean squared error in m^2. Without a loss scale its gradients fall
  below fp16's range: fp32, bf16 and fp16 with a scaler learn, fp16 alone stalls.

The classifiers train with SGD (momentum 0.9) on ``cross_entropy`` and batches of 64; the beam with
Adam on ``mse_loss`` and batches of 256 (``TrainConfig``'s defaults per model).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ampviz.training import MLP  # the plain MLP of notebook 07's frozen-weights experiment
from ampviz.training.live.config import MODELS, _DEFAULT_BATCH


# ------------------------------------------------------------------ models and data
class SequenceClassifier(nn.Module):
    """Embedding + position embedding -> TransformerEncoder with a padding mask -> masked mean -> Linear."""

    def __init__(self, vocab=10, max_len=16, d_model=32, nhead=4, dim_feedforward=64, num_layers=2,
                 classes=9):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers)
        self.head = nn.Linear(d_model, classes)

    def forward(self, tokens: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        h = self.embed(tokens) + self.pos(positions)
        h = self.encoder(h, src_key_padding_mask=pad_mask)
        keep = (~pad_mask).unsqueeze(-1).to(h.dtype)
        pooled = (h * keep).sum(dim=1) / keep.sum(dim=1)
        return self.head(pooled)


@dataclass
class Task:
    """A model, its batches and the modules the activation census watches by default.

    ``batch()`` returns ``(inputs, targets)``: a tuple of CPU tensors for ``model(*inputs)`` and
    the targets (class labels, or the beam's deflections), drawn from the task's own seeded
    generator (a fresh batch per call). ``loss(output, targets)`` is the task's loss and
    ``optimizer`` its optimizer ("sgd": SGD with momentum 0.9, "adam": Adam).
    """

    model: nn.Module
    make_batch: object
    watch: tuple
    loss: object = nn.functional.cross_entropy
    optimizer: str = "sgd"

    def batch(self):
        return self.make_batch()


def build_task(name: str = "mlp", seed: int = 0, batch_size: int | None = None) -> Task:
    """The seeded model and data stream ``name`` ("mlp", "transformer" or "beam"), on the CPU in
    float32; ``batch_size=None`` takes the model's default.

    The model's initialisation draws from torch's global generator seeded with ``seed`` inside
    ``torch.random.fork_rng`` (the caller's random state is left alone); the data come from their
    own ``torch.Generator`` seeded with ``seed + 1``.
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    if batch_size is None:
        batch_size = _DEFAULT_BATCH[name]
    if name == "beam":
        data = _beam_data(seed + 1)
        model = data.model(seed)
        watch = tuple(n for n, m in model.named_modules() if isinstance(m, nn.Linear))
        return Task(model, data.sampler(batch_size, seed + 2), watch, nn.functional.mse_loss, "adam")
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name == "mlp":
            model = MLP()
        else:
            model = SequenceClassifier()
    if name == "mlp":
        features = model[0].in_features
        classes = model[-1].out_features
        teacher = torch.randn(features, classes, generator=gen)

        def make_batch():
            x = torch.randn(batch_size, features, generator=gen)
            return (x,), (x @ teacher).argmax(dim=1)

        watch = tuple(n for n, m in model.named_children() if isinstance(m, nn.Linear))
        return Task(model, make_batch, watch)

    vocab, max_len = model.embed.num_embeddings, model.pos.num_embeddings

    def make_batch():
        lengths = torch.randint(max_len // 4, max_len + 1, (batch_size,), generator=gen)
        tokens = torch.randint(1, vocab, (batch_size, max_len), generator=gen)
        pad_mask = torch.arange(max_len).unsqueeze(0) >= lengths.unsqueeze(1)
        tokens[pad_mask] = 0
        counts = nn.functional.one_hot(tokens, vocab)[:, :, 1:].sum(dim=1)  # padding (0) not counted
        return (tokens, pad_mask), counts.argmax(dim=1)  # ties: the smallest token

    watch = ("embed",) + tuple(f"encoder.layers.{i}" for i in range(len(model.encoder.layers))) + ("head",)
    return Task(model, make_batch, watch)


_BEAM_DATA: dict = {}


def _beam_data(seed: int):
    """The beam data set for ``seed`` (5,120 beams), made once per process."""
    from ampviz.training.beam import BeamData

    if seed not in _BEAM_DATA:
        _BEAM_DATA.clear()  # one data set at a time: 1.4 MB each
        _BEAM_DATA[seed] = BeamData(seed)
    return _BEAM_DATA[seed]
