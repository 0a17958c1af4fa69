"""Lesson 08's questions that ask why: each a ``Choice`` (``ampviz.checks``) with its checker.

Lesson 08's other checkers are in ``ampviz.pitfalls.manual_backward``, beside the runs they read;
these sit apart to keep that module short. Each right reason is held by a checked cell of the
lesson and by ``tests/pitfalls/test_pitfall_manual_backward.py``:

- ``check_why_unscale_without_scale``: why a bare ``loss.backward()`` leaves the scaler with no
  scale (section 4: ``scaler.scale()`` makes ``_scale``, and only ``manual_backward`` calls it);
- ``check_why_update_once``: why an ``update()`` inside every ``opt.step()`` gives a later
  optimizer twice its gradient (section 7);
- ``check_why_clip_in_the_hook``: why clipping belongs after the plugin's ``unscale_``
  (section 8).
"""

from __future__ import annotations

from ampviz.checks import Choice

__all__ = ["check_why_unscale_without_scale", "check_why_update_once", "check_why_clip_in_the_hook"]


WHY_UNSCALE_WITHOUT_SCALE = Choice(
    "why_unscale_without_scale",
    "Under real fp16 AMP in manual optimization, a bare loss.backward() makes the first opt.step() raise "
    "'Attempted unscale_ but _scale is None'. Why?",
    {"a": "the precision plugin has no scaler, as with precision=\"16-mixed\" on the CPU",
     "b": "the first iteration's fp16 gradients overflowed, and the scaler dropped its scale",
     "c": "the scaler makes its _scale at its first scaler.scale(loss), and only self.manual_backward(loss) "
          "calls that (in the plugin's pre_backward); loss.backward() goes around it, and opt.step() "
          "unscales all the same",
     "d": "the scaler cannot tell several optimizers (or a ReduceLROnPlateau scheduler) apart, and "
          "unscales the wrong one"},
    "c",
    {"a": "with no scaler nothing is unscaled and nothing raises (section 2); section 3's plugin has a real "
          "GradScaler, which had not made its scale yet",
     "b": "section 4's table shows _scale None from the start of the first iteration, before any gradient "
          "existed, while the run with manual_backward keeps 65536 on the same data",
     "d": "one optimizer and no scheduler raise it (sections 3 and 4)"},
)


WHY_UPDATE_ONCE = Choice(
    "why_update_once",
    "One self.manual_backward(loss) feeds two optimizers under Lightning's fp16 plugin, and only "
    "optimizer 1's gradients overflow. Why does optimizer 2 apply twice its true gradient, while "
    "PyTorch's recipe (one scaler.update() after every optimizer has stepped) applies it exactly?",
    {"a": "an overflow halves the scale once for every optimizer, so the scale falls twice as fast",
     "b": "Lightning runs update() inside each opt.step(): optimizer 1's update() halved the scale before "
          "optimizer 2 unscaled, so gradients multiplied by 65536 were divided by 32768",
     "c": "growth_interval counts optimizer steps, not iterations, so with two optimizers the scale grows "
          "twice as often"},
    "b",
    {"a": "the scale was halved once, by the one optimizer that overflowed (section 7's second table); "
          "what doubles optimizer 2's gradient is the scale it was divided by",
     "c": "that is true, but no scale grew here: in section 7's second table the scale after each step "
          "only stays or falls"},
)


WHY_CLIP_IN_THE_HOOK = Choice(
    "why_clip_in_the_hook",
    "Under fp16 AMP in manual optimization, why must self.clip_gradients run in on_before_optimizer_step, "
    "and not right before opt.step()?",
    {"a": "right before opt.step() the gradients are still multiplied by the scale: clipping cuts that "
          "scaled norm to the clip value, and the plugin's unscale_ then divides it by the scale; the hook "
          "runs after that unscale_",
     "b": "clipping right before opt.step() raises 'unscale_() has already been called on this optimizer'",
     "c": "Lightning clips for you inside opt.step(), so a clip of your own before it clips twice"},
    "a",
    {"b": "clipping right before opt.step() runs without an error (section 8's first rows); that message "
          "comes from calling scaler.unscale_(opt.optimizer) yourself",
     "c": "Lightning refuses gradient_clip_val under manual optimization (section 8), so your call is the "
          "only clip, and the optimizer applied clip value / scale, not the clip value"},
)


check_why_unscale_without_scale = WHY_UNSCALE_WITHOUT_SCALE.checker()


check_why_update_once = WHY_UPDATE_ONCE.checker()


check_why_clip_in_the_hook = WHY_CLIP_IN_THE_HOOK.checker()
