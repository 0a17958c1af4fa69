"""``torch.autocast``, measured: which dtype each op runs in, why the loss comes out float32, and
the weight cache (torch).

``ampviz/__init__.py`` never imports this module, so ``import ampviz`` stays free of torch.

Everything a lesson prints from here is measured by running the installed torch; nothing is taken
from a list of what torch is supposed to do, except the one column that says so ("torch docs").

* ``layer_walk``: one ``nn.Linear`` under CPU autocast as the dispatcher sees it (the casts of
  its input, weight and bias, the ``addmm`` on the copies, the fp32 parameter and its fp32
  gradient); ``under_autocast``: the same record for any code (a lesson's *Try it*).
* ``op_table``: about forty ops learners meet, each run under ``torch.autocast`` on float32
  inputs; each cell is the dtype that came out and the rule that made it (see ``Cell``). Next to
  the CPU columns: what torch's documentation lists for CUDA (documented, not measured), and what
  this torch build's CUDA autocast rules do, run on fake CUDA tensors
  (``torch._subclasses.FakeTensorMode``: the same autocast code picks the dtypes, no GPU kernel
  runs) or on a real GPU (``cuda="fake"``, ``"gpu"``, or ``"auto"``: the GPU when there is one).
  Where CPU and CUDA autocast disagree, the last column says so (``OpTable.differences_table``).
* ``loss_report``, ``loss_table``: a linear model under float16 autocast: the dtype of its output,
  of the loss, of ``loss * 65536``, the largest gradient that reaches the float16 output in the
  scaled backward, and whether a real ``torch.amp.GradScaler("cpu")`` skips the first step.
* ``weight_casts``, ``cache_table``: how often autocast casts a weight in two forwards, counted at
  the dispatcher (a ``TorchDispatchMode`` sees every cast autocast makes), in each arrangement of
  ``CACHE_CASES`` (one block, nested blocks, separate blocks, ``cache_enabled=False``,
  ``torch.clear_autocast_cache()``, ``no_grad``, ``inference_mode``, a frozen weight, a nested
  block with the other dtype); ``cache_table`` puts next to each count whether a weight changed in
  place between the forwards is seen (``ampviz.pitfalls.autocast_cache.in_place_update``).
* ``compile_report``, ``compile_table``: the same in-place update with a ``torch.compile``-d forward.
* ``check_*``: the exercise checkers of lesson 03a; each expected answer comes from a real run.

The CPU autocast lists of torch 2.13 (``aten/src/ATen/autocast_mode.cpp``, the
``TORCH_LIBRARY_IMPL(aten, AutocastCPU, m)`` block; the CUDA lists are the ``AT_FORALL_*`` macros of
``aten/src/ATen/autocast_mode.h``, shipped in the wheel as ``torch/include/ATen/autocast_mode.h``):

- ``lower_precision_fp`` (inputs cast to the autocast dtype): conv1d/2d/3d, conv_transpose1d/2d/3d,
  conv_tbc, _convolution, bmm, mm, linalg_vecdot, baddbmm, addmm, _addmm_activation, addbmm,
  linear, matmul, prelu, mkldnn_rnn_layer, scaled_dot_product_attention,
  _native_multi_head_attention;
- ``fp32`` (inputs cast to float32): the losses (mse_loss, nll_loss, cross_entropy_loss, l1_loss,
  smooth_l1/huber, kl_div, binary_cross_entropy, binary_cross_entropy_with_logits, the margin and
  embedding losses, ctc_loss...), prod, quantile, cdist, trace, 3-d pooling, reflection/replication
  padding, grid_sampler, stft and the fft_* ops, the linalg_*/cholesky/qr/svd/... solvers;
- ``promote`` (mixed inputs cast to the widest): cat, stack, index_copy;
- everything else falls through (``m.fallback(makeFallthrough())``) and runs in its input's dtype:
  among them softmax, log_softmax, layer_norm, group_norm, rms_norm, softplus, exp, log, pow, sum,
  cumsum, norm (which CUDA autocast runs in float32), mv and addmv (CUDA: float16), and relu, gelu,
  batch_norm, mean, dropout (which CUDA autocast leaves alone too).

Results that a lesson prints do not depend on the thread count, nor (with ``cuda="fake"``) on
whether a GPU is present. The numbers in ``loss_table``
(a loss, a gradient) come from float16 matrix products and may differ in the last digits from one
CPU kernel set to another; they are printed to four digits, and the dtypes, the overflow and the
skipped step do not depend on them.

Where the code lives (this module re-exports it all, so ``from ampviz.training.autocast import X``
keeps working): ``dispatch`` (dtype names, the cast and op recorders), ``ops``
(the documented CUDA lists, ``Cell`` and its rules, the op list, measuring one op),
``dtype_table`` (``op_table``), ``walk`` (``layer_walk``, ``under_autocast``),
``loss`` (``loss_report``, ``loss_table``), ``weight_cache`` (``weight_casts``,
``cache_table``), ``compile`` (``compile_report``, ``compile_table``) and
``checkers`` (the ``check_*`` exercise checkers).
"""

from __future__ import annotations

# Re-exported from the modules below: the public API (``__all__``) and the private names other
# modules and tests use. Patch a module-level value where the code that reads it lives.
from ampviz.training.autocast.ops import (_OPS, CUDA_DOCS_BANNED, CUDA_DOCS_FP16, CUDA_DOCS_FP32,
    CUDA_DOCS_PROMOTE, OPS, Cell, _measure)
from ampviz.training.autocast.walk import MAX_TRY_OPS, AutocastRun, layer_walk, under_autocast
from ampviz.training.autocast.dtype_table import CUDA_SOURCES, OpRow, OpTable, _cuda_where, _rule_of, op_table
from ampviz.training.autocast.loss import LOSSES, OTHER_LOSSES, LossReport, loss_report, loss_table
from ampviz.training.autocast.weight_cache import (_STALE_CASE, CACHE_CASES, CacheReport, _autocast_depth,
    cache_table, weight_casts)
from ampviz.training.autocast.compile import BACKENDS, CompileReport, compile_report, compile_table
from ampviz.training.autocast.checkers import (check_casts_inside_outer, check_softmax_dtype,
    check_sum_loss_step, check_why_softmax_dtype, check_why_stale_copy)

__all__ = [
    "CUDA_DOCS_FP16",
    "CUDA_DOCS_FP32",
    "CUDA_DOCS_PROMOTE",
    "OPS",
    "Cell",
    "OpRow",
    "OpTable",
    "op_table",
    "LOSSES",
    "LossReport",
    "loss_report",
    "loss_table",
    "CACHE_CASES",
    "CacheReport",
    "weight_casts",
    "cache_table",
    "BACKENDS",
    "CompileReport",
    "compile_report",
    "compile_table",
    "CUDA_SOURCES",
    "OTHER_LOSSES",
    "layer_walk",
    "AutocastRun",
    "under_autocast",
    "check_softmax_dtype",
    "check_sum_loss_step",
    "check_casts_inside_outer",
    "check_why_softmax_dtype",
    "check_why_stale_copy",
]
