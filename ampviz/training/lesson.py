"""The live-training lesson's (07) questions; its tables live in ``ampviz.training.live``.

``check_mode_without_loss`` and ``check_range_shift`` read a word; ``check_why_backward_loses_more``,
``check_why_half_diverges`` and ``check_why_first_layers_freeze`` ask why (``ampviz.checks.Choice``),
each right reason held by the lesson's checked outputs and claims, and by tests/training/test_lesson.py.
"""

from __future__ import annotations


from ampviz.checks import Check, Choice, _text_is, check

__all__ = ['check_mode_without_loss', 'check_range_shift', 'check_why_backward_loses_more', 'check_why_half_diverges',
           'check_why_first_layers_freeze']


# ----- 05: live training -----
def check_mode_without_loss(answer) -> Check:
    """Q: which mode lost no gradient to underflow at step 0, "fp16" or "fp16+scaler"."""
    return check(answer, "fp16+scaler", accept=_text_is("fp16+scaler", "fp16 + scaler", "fp16 with a scaler",
                                                        "fp16 with scaler", "fp16+gradscaler"),
                 hint="which mode multiplied the loss before the backward pass?")


def check_range_shift(answer) -> Check:
    """Q: with a batch of 1024 instead of 256, does the low end of the beam model's recommended
    initial scale (``examine``) go "up" or "down"? "up": more of its gradients are lost at scale 1
    (tests/training/test_doctor.py measures it)."""
    return check(answer, "up", accept=_text_is("up", "higher", "it goes up", "rises", "larger"),
                 hint="a larger batch divides each output's gradient by more: does that lose more or fewer?")


# ----- questions that ask why -----
WHY_BACKWARD_LOSES_MORE = Choice(
    "why_backward_loses_more",
    "At step 0, fp16 autocast's backward pass loses far more of each layer's weight gradients than a cast of "
    "fp32's gradients to fp16 would. Why?",
    {"a": "the fp16 run has learned less than the fp32 run, so its gradients are smaller",
     "b": "the backward pass runs in fp16 layer by layer: a layer output's gradient that underflows is 0 "
          "there, and every gradient computed from it, the weights' below included, is lost with it",
     "c": "the loss underflows in fp16, so the backward pass starts from 0",
     "d": "autocast keeps the fp16 run's weights in fp16"},
    "b",
    {"a": "at step 0 neither run has learned anything: both start from the same seeded weights on the same batch",
     "c": "the loss, 83 mm² (8.3·10^-5 m², section 1), is far above fp16's smallest subnormal, and the backward "
          "pass starts from its gradient, 1, not from its value",
     "d": "autocast keeps the weights in fp32 and runs the arithmetic in fp16; only the half mode converts the "
          "weights (section 1)"},
)

WHY_HALF_DIVERGES = Choice(
    "why_half_diverges",
    "The beam model with pure fp16 weights and Adam (the half mode) diverges at step 1. Why?",
    {"a": "its gradients overflow fp16 in the first backward pass",
     "b": "Adam divides each update by the square root of its running mean of squared gradients plus eps, "
          "and in fp16 eps is 0 and so are the squares of gradients this small: the first update divides by 0",
     "c": "the learning rate, 10^-3, rounds to 0 in fp16",
     "d": "its loss overflows fp16 at step 0"},
    "b",
    {"a": "this model's gradients are tiny (section 2), nowhere near fp16's largest value, 65504",
     "c": "a learning rate of 0 would leave the weights as they were; section 5's message says the update "
          "made them inf or NaN",
     "d": "the run passed step 0 and failed at step 1: section 5's message says its first update made "
          "weights inf or NaN"},
)

WHY_FIRST_LAYERS_FREEZE = Choice(
    "why_first_layers_freeze",
    "In section 5's MLP with pure fp16 weights, fc1 hardly moves in 100 steps while fc12 moves about as much "
    "as with fp32 master weights. Why?",
    {"a": "the learning rate rounds to 0 in fp16",
     "b": "SGD's own small numbers are 0 in fp16, as Adam's eps was",
     "c": "fc1's updates, the learning rate times gradients around 10^-6, are below half the gap between "
          "each weight and its fp16 neighbour, so the weight rounds back to itself; the last layers' "
          "gradients are larger"},
    "c",
    {"a": "the same learning rate moves fc12 about as much as with master weights (section 5's table)",
     "b": "SGD with momentum keeps no small number of its own (section 5), and the same optimizer moves fc12 "
          "in pure fp16"},
)


check_why_backward_loses_more = WHY_BACKWARD_LOSES_MORE.checker()


check_why_half_diverges = WHY_HALF_DIVERGES.checker()


check_why_first_layers_freeze = WHY_FIRST_LAYERS_FREEZE.checker()
