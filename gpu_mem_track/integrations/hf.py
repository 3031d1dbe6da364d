"""Memory stamps for the Hugging Face ``transformers.Trainer``: ``HFMemTrackCallback``.

``Trainer(..., callbacks=[HFMemTrackCallback()])`` stamps ``train start``; in the first
optimizer step ``step 1 forward`` (a forward hook on the model, removed after it fired),
``step 1 backward`` (``on_pre_optimizer_step``: gradients present, clipped) and ``step 1
optimizer step`` (``on_optimizer_step``: optimizer state created, before ``zero_grad``);
then ``step N`` every ``every`` steps and ``train end``. See
``gpu_mem_track.integrations.session`` for the folder, the ranks and the options.

Needs transformers 4.45 or later (``on_pre_optimizer_step``) and accelerate, which the
Trainer needs anyway: ``pip install "gpu_mem_track[hf]"``.
"""

from __future__ import annotations

from typing import Any

from .session import SessionCallback, TrainingSession, missing_extra, package_dirs

try:
    from transformers import TrainerCallback
except ModuleNotFoundError as exc:
    error = missing_extra(exc, ("transformers",), "hf", __name__)
    if error is None:
        raise
    raise error from exc

__all__ = ["HFMemTrackCallback"]

_FRAMEWORK = ("torch", "transformers", "accelerate")


class HFMemTrackCallback(SessionCallback, TrainerCallback):
    """A ``transformers.TrainerCallback`` that stamps the tracked device's memory at train
    start, after the first step's forward, backward and optimizer step, every ``every``
    optimizer steps (``state.global_step``) and at train end.

    Args:
        every: stamp ``step N`` after every ``every``-th optimizer step from step 2 on; 0
            stamps only the first step.
        **options: ``out_dir``, ``run_name``, ``device``, ``verbosity``, ``activations``
            and ``MemTracker``'s own options; see ``session.TrainingSession``.

    ``tracker`` (the ``MemTracker``) and ``folder`` (the run folder) are set at train start.
    """

    def __init__(self, every: int = 100, **options: Any) -> None:
        self.session = TrainingSession(every, skip=package_dirs(*_FRAMEWORK), **options)
        self._hook: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        optimizer = kwargs.get("optimizer")
        self.session.start(model, [optimizer] if optimizer is not None else [])

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self.session.first_forward_due and model is not None and self._hook is None:
            self._hook = model.register_forward_hook(self._after_forward, always_call=True)
            self.session.first_forward_begins()

    def _after_forward(self, module: Any, args: Any, output: Any) -> None:
        self._remove_hook()
        if output is None:  # forward raised: always_call hooks still run, with no result
            self.session.stop_recording()
        else:
            self.session.first_step_event("step 1 forward")

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.first_step_event("step 1 backward")

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.first_step_event("step 1 optimizer step")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._remove_hook()
        self.session.step_end(state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._remove_hook()
        self.session.end()

    def _remove_hook(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
