"""The live-training lesson's (07) questions; its tables live in ``ampviz.training.live``.
"""

from __future__ import annotations


from ampviz.checks import Check, _text_is, check

__all__ = ['check_mode_without_loss', 'check_range_shift']


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



