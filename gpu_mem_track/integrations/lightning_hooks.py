"""The Lightning callback's hooks, shared by ``lightning`` and ``pytorch_lightning``.

Both packages define their own ``Callback`` base class (a ``lightning.Trainer`` calls a
``lightning.pytorch.Callback``, a ``pytorch_lightning.Trainer`` a
``pytorch_lightning.Callback``); ``integrations.lightning`` and
``integrations.pytorch_lightning`` each join this mixin to their package's base. It
imports neither package.

Hooks used (Lightning 2.x, automatic and manual optimization): ``on_train_start``,
``on_train_batch_start`` (recording activations for the first forward),
``on_before_backward`` (``step 1 forward``: loss computed), ``on_after_backward`` (``step
1 backward``), ``on_before_optimizer_step`` then ``on_train_batch_end`` (``step 1
optimizer step``: after ``optimizer.step()``; Lightning zeroes gradients at the start of
the next step), ``on_train_batch_end`` with ``trainer.global_step`` for ``step N``,
``on_train_end``, and ``on_exception`` (stops recording).
"""

from __future__ import annotations

from typing import Any

from .session import SessionCallback, TrainingSession, package_dirs

__all__ = ["LightningHooks"]

_FRAMEWORK = (
    "torch",
    "lightning",
    "pytorch_lightning",
    "lightning_fabric",
    "lightning_utilities",
    "torchmetrics",
)


class LightningHooks(SessionCallback):
    """A Lightning ``Callback``'s memory stamps: at train start, after the first step's
    forward, backward and optimizer step, every ``every`` optimizer steps
    (``trainer.global_step``) and at train end.

    Args:
        every: stamp ``step N`` after every ``every``-th optimizer step from step 2 on; 0
            stamps only the first step.
        **options: ``out_dir``, ``run_name``, ``device``, ``verbosity``, ``activations``
            and ``MemTracker``'s own options; see ``session.TrainingSession``.

    ``tracker`` (the ``MemTracker``) and ``folder`` (the run folder) are set at train start.
    """

    def __init__(self, every: int = 100, **options: Any) -> None:
        self.session = TrainingSession(every, skip=package_dirs(*_FRAMEWORK), **options)
        self._stepped = False

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._stepped = False
        self.session.start(pl_module, list(getattr(trainer, "optimizers", None) or ()))

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.session.first_forward_begins()

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self.session.first_step_event("step 1 forward")

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        self.session.first_step_event("step 1 backward")

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._stepped = True

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._stepped:
            self._stepped = False
            self.session.first_step_event("step 1 optimizer step")
        self.session.step_end(trainer.global_step)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.session.end()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.session.stop_recording()
