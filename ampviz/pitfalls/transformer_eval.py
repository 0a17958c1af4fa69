"""Pitfall 3: ``nn.TransformerEncoder`` under ``precision="bf16-mixed"`` crashes only in validation.

The model (``EncoderClassifier``): token embedding plus a learned position embedding, an
``nn.TransformerEncoder`` (``batch_first=True``, post-norm, no dropout, ``enable_nested_tensor=True``
by default) called with a ``src_key_padding_mask`` for right-padded sequences, a mean over the real
positions (masked pooling) and a linear head. The data (``make_data``): seeded sequences of tokens
1 ... 9, each right-padded with token 0 to a common length; the label is the most frequent token.

What the scenarios show (torch 2.13, lightning 2.6, CPU):

- ``crash()`` (``lightning_run("bf16-mixed")``): the training steps run; the first validation raises
  ``RuntimeError: expected scalar type Float but found BFloat16`` inside
  ``torch._transformer_encoder_layer_fwd`` (``... found Half`` under fp16 autocast in plain torch;
  Lightning turns ``"16-mixed"`` into ``"bf16-mixed"`` on the CPU). In eval mode, with no gradient
  to record, the encoder packs the padded batch into a nested tensor and takes the fused "fast
  path"; CPU autocast hands its LayerNorm bf16 activations while the weights are fp32. With
  Lightning's default sanity check (``sanity_steps=2``) it raises before any training step;
  ``trainer.validate/test/predict`` (``stage=``) raise the same under ``inference_mode``.
- ``condition_table()``: the same encoder call in plain torch (``encoder_call``), with each
  condition switched off in turn: which of them the crash needs. ``encoder_call`` also tries a
  frozen encoder under grad (it crashes) and a causal attention mask (it runs). Both take
  ``device="cuda"``. What follows from torch's source, and what ``tests/training/test_gpu.py`` checks on a
  GPU: there nothing crashes. The encoder's fast-path check asks ``torch.is_autocast_enabled()``,
  which reads CUDA's autocast only, so under CUDA autocast the encoder always runs its layers as
  Python modules (fp32 output: CUDA autocast runs ``layer_norm`` in fp32), and only without
  autocast does it pack the batch (its padded positions come out exactly 0).
- ``old_message()``: the message older torch printed for this bug,
  ``mat1 and mat2 must have the same dtype, but got BFloat16 and Float``, raised by the op that
  used to receive the mixed dtypes.
- ``fix_runs()`` / ``fix_table()``: each fix run through the real Trainer, with its validation loss
  next to the fp32 (``"32-true"``) reference; ``fix_runs(pool="all")`` pools over every position.
- ``check_sanity_steps``, ``check_fp32_fast_path``, ``check_frozen_encoder``: the lesson's exercises;
  ``check_why_only_validation``, ``check_why_not_under_cuda_autocast``: its questions that ask why.

Lightning is imported inside the functions that need it; nothing here runs on import.
"""

from __future__ import annotations

import contextlib
import traceback
import warnings

import numpy as np
import torch
from torch import nn

from ampviz.checks import Check, Choice, _said, _yes_no, check
from ampviz.text import Table
from ampviz.pitfalls import Outcome, outcome_of, quiet_trainer
from ampviz._args import _shown
from ampviz._args import _flag, _real, _seed, _whole

__all__ = ["EncoderClassifier", "make_data", "encoder_call", "condition_table", "CONDITIONS",
           "old_message", "lightning_run", "crash", "FIXES", "fix_runs", "fix_table", "fastpath_disabled",
           "check_all_false_mask", "check_furthest_fix", "check_fp32_fast_path", "check_sanity_steps",
           "check_frozen_encoder", "check_why_only_validation", "check_why_not_under_cuda_autocast"]

VOCAB, MAX_LEN, D_MODEL, NHEAD, FFN, LAYERS, CLASSES = 10, 12, 16, 2, 32, 2, 9
TRAIN_BATCHES, VAL_BATCHES, BATCH = 8, 2, 16
#: The most sequences ``make_data`` makes (its one-hot count takes 960 bytes a sequence).
MAX_SEQUENCES = 100_000
#: The deepest encoder ``encoder_call`` builds.
MAX_LAYERS = 64


@contextlib.contextmanager
def _no_nested_warning():
    """Torch warns that nested tensors are a prototype each time the encoder packs a batch."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors")
        yield


@contextlib.contextmanager
def fastpath_disabled():
    """``torch.backends.mha.set_fastpath_enabled(False)`` for the block; the previous setting is restored."""
    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(before)


def make_encoder(*, batch_first=True, norm_first=False, nested=True, layers=LAYERS) -> nn.TransformerEncoder:
    layer = nn.TransformerEncoderLayer(D_MODEL, NHEAD, FFN, dropout=0.0, batch_first=batch_first,
                                       norm_first=norm_first)
    with warnings.catch_warnings():  # "enable_nested_tensor is True, but ... norm_first was True" etc.
        warnings.simplefilter("ignore")
        return nn.TransformerEncoder(layer, layers, enable_nested_tensor=nested)


class EncoderClassifier(nn.Module):
    """Embedding + position embedding -> TransformerEncoder with a padding mask -> pooling -> Linear.

    ``nested``: the encoder's ``enable_nested_tensor``; ``fp32_island``: run the encoder with
    autocast switched off, on float32 activations (``h.float()``; with ``cast=False`` the island
    leaves out ``h.float()``); ``project``: an ``nn.Linear(16, 16)`` between the embeddings and the
    encoder (under autocast its output is bf16); ``pool``: "masked" (the mean over the real
    positions) or "all" (the mean over every position, padded ones included).
    """

    def __init__(self, *, nested: bool = True, fp32_island: bool = False, cast: bool = True,
                 project: bool = False, pool: str = "masked"):
        nested, fp32_island = _flag("nested", nested), _flag("fp32_island", fp32_island)
        cast, project, pool = _flag("cast", cast), _flag("project", project), _pool(pool)
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Embedding(MAX_LEN, D_MODEL)
        self.encoder = make_encoder(nested=nested)
        self.head = nn.Linear(D_MODEL, CLASSES)
        # made last, so that the other weights are the same with or without it
        self.project = nn.Linear(D_MODEL, D_MODEL) if project else None
        self.fp32_island, self.cast, self.pool = fp32_island, cast, pool

    def forward(self, tokens: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        h = self.embed(tokens) + self.pos(positions)
        if self.project is not None:
            h = self.project(h)
        with _no_nested_warning():
            if self.fp32_island:
                with torch.autocast(tokens.device.type, enabled=False):
                    h = self.encoder(h.float() if self.cast else h, src_key_padding_mask=pad_mask)
            else:
                h = self.encoder(h, src_key_padding_mask=pad_mask)
        if self.pool == "all":  # every position, padded ones too: their values depend on the path taken
            return self.head(h.mean(dim=1))
        # masked pooling: the fast path leaves zeros at padded positions, the slow path values
        keep = (~pad_mask).unsqueeze(-1).to(h.dtype)
        pooled = (h * keep).sum(dim=1) / keep.sum(dim=1)
        return self.head(pooled)


_POOLS = ("masked", "all")


def _pool(pool) -> str:
    if not (isinstance(pool, str) and pool in _POOLS):
        raise ValueError(f"pool must be 'masked' (mean over the real positions) or 'all' (mean over every "
                         f"position), not {_shown(pool)}")
    return pool


def make_data(batches: int, batch_size: int = BATCH, seed: int = 0, left_pad: bool = False):
    """``(tokens, pad_mask, labels)``: seeded sequences of tokens 1 ... 9, padded with 0 to ``MAX_LEN``
    (on the right; on the left with ``left_pad``); the label is the most frequent token minus 1.
    At most ``MAX_SEQUENCES`` sequences (``batches × batch_size``)."""
    batches, batch_size = _whole("batches", batches, 0), _whole("batch_size", batch_size, 0)
    seed, left_pad = _seed(seed), _flag("left_pad", left_pad)
    n = batches * batch_size
    if n > MAX_SEQUENCES:
        raise ValueError(f"batches × batch_size must be at most {MAX_SEQUENCES:,} sequences, not {n:,}")
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(MAX_LEN // 3, MAX_LEN, (n,), generator=gen)  # every row has padding
    tokens = torch.randint(1, VOCAB, (n, MAX_LEN), generator=gen)
    pad_mask = torch.arange(MAX_LEN).unsqueeze(0) >= lengths.unsqueeze(1)
    if left_pad:
        pad_mask = pad_mask.flip(1)
    tokens[pad_mask] = 0
    counts = nn.functional.one_hot(tokens, VOCAB)[:, :, 1:].sum(dim=1)
    return tokens, pad_mask, counts.argmax(dim=1)


# ------------------------------------------------------------------ plain torch: the conditions
#: (condition, the change that switches it off, keyword arguments of ``encoder_call``)
CONDITIONS = (
    ("all conditions hold", "nothing switched off", {}),
    ("eval mode", "train mode", {"train": True}),
    ("no gradient to record", "grad enabled", {"grad": "enabled"}),
    ("no gradient to record", "inference_mode instead of no_grad", {"grad": "inference_mode"}),
    ("nested-tensor fast path", "enable_nested_tensor=False", {"nested": False}),
    ("fast path enabled", "set_fastpath_enabled(False)", {"fastpath": False}),
    ("a padding mask", "src_key_padding_mask=None", {"mask": "none"}),
    ("a padding mask", "an all-False mask (no padding)", {"mask": "all-false"}),
    ("right padding", "left padding", {"mask": "left"}),
    ("batch_first=True", "batch_first=False", {"batch_first": False}),
    ("norm_first=False", "norm_first=True", {"norm_first": True}),
    ("nn.TransformerEncoder", "one TransformerEncoderLayer called directly", {"layer_only": True}),
    ("nn.TransformerEncoder", "num_layers=1", {"layers": 1}),
    ("autocast (bf16)", "no autocast", {"autocast": None}),
    ("autocast (bf16)", "autocast in fp16", {"autocast": torch.float16}),
)


_GRAD_MODES = ("no_grad", "inference_mode", "enabled")
_MASKS = ("right", "left", "all-false", "none")


def _device(device) -> torch.device:
    """``device`` as a torch device: None is the CPU; a CUDA device must exist."""
    if device is None:
        return torch.device("cpu")
    what = "None (the CPU), 'cpu', or a CUDA device such as 'cuda' or 'cuda:0'"
    if isinstance(device, torch.device):
        dev = device
    elif isinstance(device, str):
        try:
            dev = torch.device(device)
        except (RuntimeError, ValueError):
            raise ValueError(f"device must be {what}, not {_shown(device)}") from None
    else:
        raise TypeError(f"device must be {what}, not {_shown(device)}")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be {what}, not {_shown(device)}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {_shown(device)} needs a CUDA device, and torch.cuda.is_available() is False "
                             f"here: pass device=None for the CPU")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {_shown(device)} does not exist: this machine has "
                             f"{torch.cuda.device_count()} CUDA device(s), numbered from 0")
    return dev


def encoder_call(*, train=False, grad="no_grad", nested=True, fastpath=True, mask="right",
                 batch_first=True, norm_first=False, layers=LAYERS, layer_only=False,
                 autocast=torch.bfloat16, frozen=False, causal=False, seed=0, device=None) -> Outcome:
    """One call of a fresh seeded fp32 ``nn.TransformerEncoder`` on a padded batch, in plain torch.

    The defaults are the crashing case: eval mode, ``no_grad``, nested tensors on, fast path on, a
    right-padded mask, ``batch_first=True``, ``norm_first=False``, two layers, CPU autocast in bf16.
    ``grad``: "no_grad", "inference_mode" or "enabled"; ``mask``: "right", "left", "all-false" or
    "none"; ``layer_only``: call the encoder's first layer directly (no nested tensor is packed);
    ``autocast``: a dtype, or None for none; ``frozen``: the encoder's weights do not require grad
    (``requires_grad_(False)``; the input never does); ``causal``: pass a causal attention mask
    (``mask=`` / ``src_mask=``) besides the padding mask. ``device``: None or "cpu" for the CPU
    (autocast is then CPU autocast), or a CUDA device such as "cuda" (CUDA autocast); the encoder and
    its input are made on the CPU from ``seed`` and moved there, so every device gets the same numbers.

    Returns the Outcome: the error, or ``details`` with the output dtype and, where the mask pads
    some positions, ``padded_zero``: whether every padded position of the output is exactly 0 (as the
    nested-tensor path leaves them).
    """
    train, nested, fastpath = _flag("train", train), _flag("nested", nested), _flag("fastpath", fastpath)
    batch_first, norm_first = _flag("batch_first", batch_first), _flag("norm_first", norm_first)
    layer_only, frozen, causal = _flag("layer_only", layer_only), _flag("frozen", frozen), _flag("causal", causal)
    if not (isinstance(grad, str) and grad in _GRAD_MODES):
        raise ValueError(f"grad must be one of {', '.join(map(repr, _GRAD_MODES))}, not {_shown(grad)}")
    if not (isinstance(mask, str) and mask in _MASKS):
        raise ValueError(f"mask must be one of {', '.join(map(repr, _MASKS))}, not {_shown(mask)}")
    if not any(autocast is dt for dt in (None, torch.bfloat16, torch.float16)):
        raise ValueError(f"autocast must be torch.bfloat16, torch.float16 or None (the dtypes autocast "
                         f"runs in), not {_shown(autocast)}")
    layers, seed, dev = _whole("layers", layers, 1, MAX_LAYERS), _seed(seed), _device(device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        enc = make_encoder(batch_first=batch_first, norm_first=norm_first, nested=nested, layers=layers)
        x = torch.randn(4, MAX_LEN, D_MODEL)
    if layer_only:
        enc = enc.layers[0]
    enc, x = enc.to(dev), x.to(dev)
    enc.train(train)
    enc.requires_grad_(not frozen)
    pad = torch.arange(MAX_LEN).unsqueeze(0) >= torch.tensor([[5], [9], [12], [7]])
    pad_mask = {"right": pad, "left": pad.flip(1), "all-false": torch.zeros_like(pad), "none": None}[mask]
    pad_mask = None if pad_mask is None else pad_mask.to(dev)
    # boolean like the padding mask (True: may not attend), so torch warns of no mismatch
    attn_mask = torch.ones(MAX_LEN, MAX_LEN, dtype=torch.bool, device=dev).triu(1) if causal else None
    if not batch_first:
        x = x.transpose(0, 1)
    grad_ctx = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode,
                "enabled": contextlib.nullcontext}[grad]
    amp = (torch.autocast(dev.type, dtype=autocast) if autocast is not None else contextlib.nullcontext())

    def call():
        with grad_ctx(), amp, _no_nested_warning(), (contextlib.nullcontext() if fastpath else fastpath_disabled()):
            out = enc(x, attn_mask, src_key_padding_mask=pad_mask)
        details = {"dtype": str(out.dtype).replace("torch.", "")}
        if pad_mask is not None and pad_mask.any():
            padded = out if batch_first else out.transpose(0, 1)
            details["padded_zero"] = bool((padded[pad_mask] == 0).all())
        return {"details": details}

    return outcome_of("encoder call", call)


def condition_table(device=None) -> Table:
    """Each condition of the crash, the change that switches it off, and what the encoder call then
    does; ``device``: as in ``encoder_call`` (None: the CPU)."""
    dev = _device(device)
    rows = []
    for condition, change, kwargs in CONDITIONS:
        out = encoder_call(**kwargs, device=dev)
        result = f"{out.error_type}: {out.message}" if out.failed else f"runs ({out.details['dtype']} output)"
        rows.append((condition, change, result))
    where = "the CPU" if dev.type == "cpu" else f"the GPU ({dev})"
    return Table(("condition", "changed to", "outcome"), rows,
                 title=f"nn.TransformerEncoder, eval + no_grad + bf16 autocast on {where}, one change at a time")


def old_message() -> Outcome:
    """The op the fast path used to call with mixed dtypes: ``torch._addmm_activation`` (a fused
    ``bias + input @ weight`` followed by ReLU) with a bf16 input and fp32 weights."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        bias, x, weight = torch.randn(4), torch.randn(2, 3).bfloat16(), torch.randn(3, 4)
    return outcome_of("torch._addmm_activation(fp32 bias, bf16 input, fp32 weight)",
                      torch._addmm_activation, bias, x, weight)


# ------------------------------------------------------------------ the real Trainer
def _context(module) -> dict:
    """The mode a step runs in: train/eval, grad, inference mode, CPU autocast and its dtype."""
    return {"training": module.training, "grad_enabled": torch.is_grad_enabled(),
            "inference_mode": torch.is_inference_mode_enabled(),
            "autocast": torch.is_autocast_enabled("cpu"),
            "autocast_dtype": str(torch.get_autocast_dtype("cpu")).replace("torch.", "")}


def _lightning_module(seed: int, **model_options):
    import lightning as L

    class LitEncoderClassifier(L.LightningModule):
        def __init__(self):
            super().__init__()
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                self.model = EncoderClassifier(**model_options)
            self.train_steps = 0
            self.train_context = {}
            self.val_losses = []
            self.val_context = {}
            self.sanity_check = False

        def training_step(self, batch, batch_idx):
            tokens, pad_mask, labels = batch
            if not self.train_steps:
                self.train_context = _context(self)
            loss = nn.functional.cross_entropy(self.model(tokens, pad_mask), labels)
            self.train_steps += 1
            return loss

        def validation_step(self, batch, batch_idx):  # also the test and predict step
            tokens, pad_mask, labels = batch
            self.val_context = _context(self)
            self.sanity_check = self.trainer.sanity_checking
            loss = nn.functional.cross_entropy(self.model(tokens, pad_mask), labels)
            if not self.trainer.sanity_checking:
                self.val_losses.append(loss.item())
            return loss

        test_step = predict_step = validation_step

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return LitEncoderClassifier()


def _loaders():
    from torch.utils.data import DataLoader, TensorDataset

    train = TensorDataset(*make_data(TRAIN_BATCHES, seed=1))
    val = TensorDataset(*make_data(VAL_BATCHES, seed=2))
    return DataLoader(train, batch_size=BATCH, shuffle=False), DataLoader(val, batch_size=BATCH, shuffle=False)


_STAGES = ("fit", "validate", "test", "predict")


def lightning_run(precision: str = "bf16-mixed", *, nested: bool = True, fp32_island: bool = False,
                  cast: bool = True, project: bool = False, pool: str = "masked", fastpath: bool = True,
                  stage: str = "fit", sanity_steps: int = 0, name: str | None = None, seed: int = 0) -> Outcome:
    """Train the seeded model for one epoch (``TRAIN_BATCHES`` SGD steps) with ``trainer.fit``, then
    evaluate on ``VAL_BATCHES`` batches: ``stage="fit"``: Lightning's end-of-epoch validation
    (under ``no_grad``); ``"validate"``, ``"test"`` or ``"predict"``: a separate
    ``trainer.validate/test/predict`` after an epoch without validation. ``sanity_steps``: the
    Trainer's ``num_sanity_val_steps`` (Lightning's default is 2; 0 here, so the training steps
    run first). ``nested``, ``fp32_island``, ``cast``, ``project``, ``pool``: the model's options
    (see ``EncoderClassifier``); ``fastpath=False``: the whole run under
    ``torch.backends.mha.set_fastpath_enabled(False)`` (restored afterwards).
    ``precision="16-mixed-fp16"``: ``plugins=[MixedPrecision("16-mixed", "cpu")]``, real fp16 autocast
    (``precision="16-mixed"`` itself becomes ``"bf16-mixed"`` on the CPU).

    Returns an Outcome: the error (and ``details["raised_in"]``, the innermost source line) or the
    mean evaluation loss; ``details`` holds the training steps done, the context of the first
    training step and of the evaluation (train mode, grad, inference mode, autocast), whether the
    last evaluation step was Lightning's sanity check, and after a run the dtype of the model's
    weights and the trained weights themselves (``state``).
    """
    if isinstance(precision, bool) or not isinstance(precision, (str, int)):
        raise TypeError(f"precision must be a Lightning precision such as 'bf16-mixed' or '32-true' "
                        f"(or '16-mixed-fp16'), not {_shown(precision)}")
    options = dict(nested=_flag("nested", nested), fp32_island=_flag("fp32_island", fp32_island),
                   cast=_flag("cast", cast), project=_flag("project", project), pool=_pool(pool))
    fastpath, seed = _flag("fastpath", fastpath), _seed(seed)
    if not (isinstance(stage, str) and stage in _STAGES):
        raise ValueError(f"stage must be one of {', '.join(map(repr, _STAGES))}, not {_shown(stage)}")
    sanity_steps = _whole("sanity_steps", sanity_steps, 0, VAL_BATCHES)
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a string or None, not {_shown(name)}")
    name = name or str(precision)
    trainer_kwargs = {"precision": precision}
    if precision == "16-mixed-fp16":  # real fp16 autocast (and GradScaler) on the CPU, via the plugin
        from lightning.pytorch.plugins import MixedPrecision

        trainer_kwargs = {"plugins": [MixedPrecision("16-mixed", "cpu")]}
    model = _lightning_module(seed, **options)
    train, val = _loaders()
    details = {}
    with contextlib.ExitStack() as stack:
        if not fastpath:
            stack.enter_context(fastpath_disabled())
        trainer = stack.enter_context(quiet_trainer(max_epochs=1, num_sanity_val_steps=sanity_steps,
                                                    **trainer_kwargs, deterministic=True))
        try:
            trainer.fit(model, train, val if stage == "fit" else None)
            if stage != "fit":
                run = {"validate": trainer.validate, "test": trainer.test, "predict": trainer.predict}[stage]
                run(model, val, **({} if stage == "predict" else {"verbose": False}))
        except Exception as exc:  # the failure is the lesson: keep its exact type and message
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            details.update(train_steps=model.train_steps, val_batches=len(model.val_losses),
                           raised_in=frame.line, train_context=model.train_context,
                           val_context=model.val_context, sanity_check=model.sanity_check)
            return Outcome(name=name, error_type=type(exc).__name__, message=str(exc), details=details)
    details.update(train_steps=model.train_steps, val_batches=len(model.val_losses),
                   train_context=model.train_context, val_context=model.val_context,
                   sanity_check=model.sanity_check,
                   weight_dtype=str(model.model.head.weight.dtype).replace("torch.", ""),
                   state={k: v.detach().clone() for k, v in model.model.state_dict().items()})
    return Outcome(name=name, loss=sum(model.val_losses) / len(model.val_losses), details=details)


def crash(precision: str = "bf16-mixed", stage: str = "fit", sanity_steps: int = 0) -> Outcome:
    """The failing run: the default model under ``precision``. On the CPU Lightning 2.6 replaces
    ``"16-mixed"`` by ``"bf16-mixed"`` (with a warning), so both raise the BFloat16 message here;
    ``"16-mixed-fp16"`` (the ``MixedPrecision("16-mixed", "cpu")`` plugin) runs fp16 autocast and
    raises ``... found Half``. ``sanity_steps``: the Trainer's ``num_sanity_val_steps``."""
    return lightning_run(precision, stage=stage, sanity_steps=sanity_steps)


#: fix -> keyword arguments of ``lightning_run``
FIXES = {
    'precision="32-true" (the fp32 reference)': dict(precision="32-true"),
    'precision="bf16-true"': dict(precision="bf16-true"),
    "fp32 island around the encoder": dict(precision="bf16-mixed", fp32_island=True),
    "enable_nested_tensor=False": dict(precision="bf16-mixed", nested=False),
    "torch.backends.mha.set_fastpath_enabled(False)": dict(precision="bf16-mixed", fastpath=False),
}


def fix_runs(pool: str = "masked") -> dict:
    """Each fix in ``FIXES`` run through the Trainer: fix name -> Outcome (validation loss in ``loss``).
    ``pool``: the model's pooling, "masked" or "all" (see ``EncoderClassifier``)."""
    pool = _pool(pool)
    return {fix: lightning_run(name=fix, pool=pool, **kwargs) for fix, kwargs in FIXES.items()}


def _check_runs(runs) -> None:
    """``runs`` as ``fix_runs()`` gives them: fix name -> Outcome, the fp32 reference first and run."""
    what = "a dict of fix name -> Outcome, as fix_runs() returns (the fp32 reference first)"
    if not isinstance(runs, dict) or not runs:
        raise TypeError(f"runs must be {what}, not {_shown(runs)}")
    for fix, out in runs.items():
        if not isinstance(out, Outcome):
            raise TypeError(f"runs must be {what}; runs[{_shown(fix)}] is {_shown(out)}")
        if not out.failed and not isinstance(out.loss, (int, float)):
            raise ValueError(f"runs[{_shown(fix)}] ran but has no validation loss: {_shown(out.loss)}")
        if not isinstance(out.details, dict):
            raise TypeError(f"runs[{_shown(fix)}].details must be a dict, not {_shown(out.details)}")
    first, ref = next(iter(runs.items()))
    if ref.failed:
        raise ValueError(f"the first run, {_shown(first)}, is the reference and must have run; "
                         f"it raised {ref.error_type}")


def fix_table(runs: dict | None = None, *, exact: bool = False, tolerance: float = 1e-3) -> Table:
    """The fixes' validation losses next to the fp32 reference (the first entry of ``FIXES``).

    By default what the lesson needs, at a precision every CPU reproduces: each loss to two decimals
    and whether it lies within ``tolerance`` of fp32's. ``exact=True``: the losses to six decimals
    and their difference from fp32's (these differ from CPU to CPU in the fourth decimal, since
    training sums in the order of the machine's vector units)."""
    exact, tolerance = _flag("exact", exact), _real("tolerance", tolerance)
    if not tolerance >= 0:
        raise ValueError(f"tolerance must be a number >= 0, not {_shown(tolerance)}")
    if runs is not None:
        _check_runs(runs)
    runs = runs if runs is not None else fix_runs()
    ref = next(iter(runs.values())).loss
    rows = []
    for fix, out in runs.items():
        if out.failed:
            rows.append((fix, "-", f"{out.error_type}: {out.message}", "-"))
            continue
        diff = out.loss - ref
        if exact:
            rows.append((fix, out.details.get("weight_dtype", "-"), f"{out.loss:.6f}",
                         "identical" if diff == 0 else f"{diff:+.1e}"))
        else:
            rows.append((fix, out.details.get("weight_dtype", "-"), f"{out.loss:.2f}",
                         "yes" if abs(diff) <= tolerance else "no"))
    last = "vs fp32" if exact else f"within {tolerance:g} of fp32"
    return Table(("fix", "weights", "validation loss", last), rows)


# ------------------------------------------------------------------ exercise checkers
def check_all_false_mask(answer) -> Check:
    """Q (predict): with an all-False padding mask (one that pads nothing) instead of the
    right-padded one, does the encoder call still crash? ("yes": the mask is there, and every
    sequence is trivially padded at its end, so the batch is packed all the same.)"""
    return check(answer, "yes", accept=_yes_no(True, {"crash", "crashes", "it crashes", "raises"}),
                 hint="the encoder decides from the mask it is given, not from how much it pads: "
                      "is an all-False mask one it can pack?")


def _fix_name(answer) -> str | None:
    """A fix named in any usual spelling, folded: 'precision="bf16-true"', "bf16 true" -> "bf16true"."""
    said = _said(answer)
    if said is None:
        return None
    said = said.removeprefix("precision").strip().lstrip("=").strip().strip("'\"")
    return "".join(c for c in said if c not in " -_'\"")


def check_furthest_fix(answer) -> Check:
    """Q (predict): which fix ends furthest from fp32's validation loss? ("bf16-true": its weights
    themselves are bf16.)"""
    return check(answer, "bf16-true", accept=lambda a: _fix_name(a) == "bf16true",
                 hint="ask in which dtype each fix keeps the weights, and what that dtype does to a "
                      "small update")


def check_fp32_fast_path(answer) -> Check:
    """Q (predict): in the fp32 reference run (``precision="32-true"``), does the validation call of
    the encoder take the nested-tensor fast path? ("yes": eval mode, no grad and a right-padded
    mask are all there; autocast is what is missing, and it only decides whether the path fails.)"""
    return check(answer, "yes", accept=_yes_no(True, {"it does", "fast path", "the fast path"}),
                 hint="go through the conditions of section 2 one by one for a validation step of the "
                      "32-true run, and ask which of them the path itself needs")


def check_sanity_steps(answer) -> Check:
    """Q (predict): with Lightning's default ``num_sanity_val_steps=2``, how many training steps run
    before the crash? (0: the sanity check validates before the first training step.)"""
    def accept(a):
        if isinstance(a, (bool, np.bool_)):
            return False
        if _said(a) in {"zero", "none", "no steps", "no training steps", "not one", "nil"}:
            return True
        return float(_said(a) if isinstance(a, str) else a) == 0
    return check(answer, 0, accept=accept,
                 hint="what does a default Trainer run before its first training step?")


def check_frozen_encoder(answer) -> Check:
    """Q (transfer): a frozen encoder (``requires_grad_(False)``, eval mode) called with grad
    enabled, on an input that does not require grad, under CPU bf16 autocast: does it crash? ("yes")"""
    return check(answer, "yes", accept=_yes_no(True, {"crash", "crashes", "it crashes", "raises"}),
                 hint="the encoder does not ask whether grad mode is on, but whether it would have to record "
                      "a gradient")


WHY_ONLY_VALIDATION = Choice(
    "why_only_validation",
    "Why does the encoder train under precision=\"bf16-mixed\" and crash only when Lightning validates?",
    {"a": "Lightning switches autocast off in validation, so bf16 weights meet fp32 activations",
     "b": "Lightning validates under torch.inference_mode(), which autocast does not support",
     "c": "only in eval mode with no gradient to record does the encoder pack the padded batch into a nested "
          "tensor and run its fused fast path, whose LayerNorm refuses bf16 activations with fp32 weights",
     "d": "validation batches are padded and training batches are not"},
    "c",
    {"a": "section 1 printed autocast on, in bf16, in validation as in training, and under bf16-mixed the "
          "weights stay float32 (section 4's table)",
     "b": "fit validates under no_grad (section 1: inference_mode False), and section 2's table crashes under "
          "no_grad and under inference_mode alike",
     "d": "training and validation batches are right-padded alike (section 1), and section 2's table runs the "
          "same padded call in train mode or with grad enabled"},
)


WHY_NOT_UNDER_CUDA_AUTOCAST = Choice(
    "why_not_under_cuda_autocast",
    "On a GPU, under CUDA autocast, the same encoder validates without a crash. Why?",
    {"a": "the bug is fixed in newer torch, and GPU builds are newer",
     "b": "the encoder asks torch.is_autocast_enabled(), which reports CUDA's autocast only: under CUDA "
          "autocast it sees autocast and runs its layers as Python modules, under CPU autocast it does not "
          "and takes the fast path",
     "c": "the GPU's fused kernel accepts bf16 activations with fp32 weights"},
    "b",
    {"a": "this torch crashes on the CPU today (section 1), and the same CPU call runs once CUDA's autocast "
          "flag is switched on by hand (section 2)",
     "c": "the fused kernel is not what decides: with CUDA's flag switched on by hand, the CPU call skips it "
          "and runs (section 2)"},
)


check_why_only_validation = WHY_ONLY_VALIDATION.checker()


check_why_not_under_cuda_autocast = WHY_NOT_UNDER_CUDA_AUTOCAST.checker()
