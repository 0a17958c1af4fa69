"""Claims of three public write-ups on the Lightning pitfalls, each beside what a real run measured.

The write-ups are named by their titles (``WRITEUP_MANUAL``, ``WRITEUP_CACHE``, ``WRITEUP_ENCODER``);
lessons 08, 09 and 10 quote a short claim of each and print these tables.

* ``accumulation_run``: the manual-optimization write-up's ``training_step`` (``manual_backward``,
  then ``opt.step()``, no ``zero_grad()``) in a real Trainer: the gradients pile up step after step.
* ``manual_claims``, ``cache_claims``, ``encoder_claims``: the lessons' tables, one row per claim,
  from the outcomes the lessons have already run (plus a cheap run or two of their own).
"""

from __future__ import annotations

import torch

from ampviz.pitfalls import Outcome, quiet_trainer
from ampviz.text import Table, measured
from ampviz._args import _shown, _whole

__all__ = ["WRITEUP_MANUAL", "WRITEUP_CACHE", "WRITEUP_ENCODER", "accumulation_run", "manual_claims",
           "cache_claims", "encoder_claims"]

#: The titles of the three write-ups (their index gives no author).
WRITEUP_MANUAL = "PyTorch Lightning混合精度训练中的手动优化陷阱"
WRITEUP_CACHE = "PyTorch Lightning中混合精度训练与手动梯度计算的问题解析"
WRITEUP_ENCODER = "PyTorch Lightning中Transformer编码器的混合精度训练问题解析"

_COLUMNS = ("write-up says", "in English", "measured here")


def accumulation_run(zero_grad: bool = False, steps: int = 2) -> Outcome:
    """A real ``Trainer`` (fp32, CPU) fitting a Linear(8, 1) by manual optimization on one fixed
    batch: ``self.manual_backward(loss)`` then ``opt.step()``, with ``opt.zero_grad()`` first only
    if ``zero_grad``. ``grad_norms["per_step"]``: ‖grad‖ after each backward;
    ``details["accumulated"]``: whether each step's ``.grad`` equals the previous step's ``.grad``
    plus that step's own gradient, exactly."""
    import lightning as L

    if not isinstance(zero_grad, bool):
        raise TypeError(f"zero_grad must be True or False, not {_shown(zero_grad)}")
    steps = _whole("steps", steps, 1, 50)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 8, generator=g)
    y = x.sum(1, keepdim=True)

    class Snippet(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False
            self.fc = torch.nn.Linear(8, 1)
            self.norms, self.accumulated = [], []

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            if zero_grad:
                opt.zero_grad()
            before = [None if p.grad is None else p.grad.clone() for p in self.parameters()]
            loss = torch.nn.functional.mse_loss(self.fc(batch[0]), batch[1])
            own = torch.autograd.grad(loss, list(self.parameters()), retain_graph=True)
            self.manual_backward(loss)
            self.accumulated.append(all(b is not None and torch.equal(p.grad, b + o)
                                        for p, b, o in zip(self.parameters(), before, own)))
            self.norms.append(float(torch.linalg.vector_norm(torch.cat([p.grad.reshape(-1)
                                                                        for p in self.parameters()]))))
            opt.step()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    L.seed_everything(0, verbose=False)
    module = Snippet()
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    with quiet_trainer(max_steps=steps, max_epochs=steps) as trainer:
        trainer.fit(module, data)
    name = "with opt.zero_grad()" if zero_grad else "as written (no zero_grad)"
    return Outcome(name=name, grad_norms={"per_step": list(module.norms)},
                   details={"accumulated": list(module.accumulated)})


def _err(out: Outcome) -> str:
    return f"{out.error_type}: {out.message}" if out.failed else "ran"


def manual_claims(bug: Outcome, on_cpu: Outcome) -> Table:
    """Lesson 08's table. ``bug``: ``fp16_loss_backward()``; ``on_cpu``: ``cpu_16_mixed()``."""
    plain, fixed = accumulation_run(False), accumulation_run(True)
    n1, n2 = plain.grad_norms["per_step"][:2]
    rows = (
        ("直接使用loss.backward()会绕过这个机制", "a bare loss.backward() bypasses the scaler",
         f"holds under real fp16 AMP, with one optimizer: {bug.error_type}; on the CPU "
         f"precision=\"16-mixed\" became {on_cpu.details.get('precision')!r} and it {_err(on_cpu)}"),
        ("self.manual_backward(loss)  opt1.step() … (no zero_grad())", "its fixed training_step, no zero_grad()",
         f"gradients accumulate: ‖grad‖ step 1 {measured(n1, 3)}, step 2 {measured(n2, 3)} "
         f"(= step 1's + step 2's own: {plain.details['accumulated'][1]}); with zero_grad() step 2 "
         f"{measured(fixed.grad_norms['per_step'][1], 3)}"),
    )
    return Table(_COLUMNS, rows, title=f"《{WRITEUP_MANUAL}》")


def cache_claims(installed: Outcome, legacy: Outcome, fix1: Outcome, nested: Outcome) -> Table:
    """Lesson 09's table. ``installed``: ``real_plain("linear")``; ``legacy``:
    ``simulated_plain("linear")``; ``fix1`` / ``nested``: ``simulated_plain("linear", fix)`` with
    ``"autocast_off_in_no_grad"`` / ``"reenter_nested"``."""
    def trains(o):
        return _err(o) if o.failed else ("trains" if all(v is not None for v in o.grad_norms.values())
                                         else "a parameter gets no .grad")
    rows = (
        ("RuntimeError: element 0 of tensors does not require grad", "a no_grad pass in autocast breaks backward",
         f"installed torch: {trains(installed)}; simulated legacy cache: {trains(legacy)}"),
        ("方案一:在no_grad上下文中禁用autocast", "fix 1: autocast off in the no_grad block",
         f"holds (legacy rule): {trains(fix1)}"),
        ("方案二:在需要梯度的计算前重新启用autocast", "fix 2: re-enter autocast for the grad pass",
         f"only at top level: nested inside the outer autocast: {trains(nested)}"),
    )
    return Table(_COLUMNS, rows, title=f"《{WRITEUP_CACHE}》")


def encoder_claims(crashed: Outcome, plain: Outcome, runs: dict) -> Table:
    """Lesson 10's table. ``crashed``: ``crash("bf16-mixed")``; ``plain``: ``encoder_call()``
    (no Lightning); ``runs``: ``fix_runs()``."""
    ref = next(iter(runs.values()))
    true = runs['precision="bf16-true"']
    rows = (
        ("mat1 and mat2 must have the same dtype, but got BFloat16 and Float", "the validation error",
         f"out of date: this torch raises {_err(crashed)}"),
        ("这个问题实际上与PyTorch Lightning无关", "it is torch's, not Lightning's",
         f"holds: plain torch, no Trainer: {plain.error_type or 'ran'}"),
        ("将precision参数设置为bf16-true", "fix: precision=\"bf16-true\"",
         f"validates ({_err(true)}); loss {true.loss:.2f} vs fp32 {ref.loss:.2f}, within 1e-3: "
         f"{abs(true.loss - ref.loss) <= 1e-3}"),
    )
    return Table(_COLUMNS, rows, title=f"《{WRITEUP_ENCODER}》")
