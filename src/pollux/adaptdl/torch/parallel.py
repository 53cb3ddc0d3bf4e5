"""``adaptdl.torch.parallel``: ``AdaptiveDataParallel`` with AdaptDL's arguments, over
:class:`pollux.torch.AdaptiveDataParallel`.

``AdaptiveDataParallel(model, optimizer, lr_scheduler=None, mp_scaler=None,
scaling_rule=None, name="adaptdl-dataparallel", **ddp_kwargs)``: the model, optimizer,
scheduler and mixed-precision scaler are checkpointed and restored; the optimizer's
learning rate follows the scaling rule (AdaptDL's defaults: AdamScale for Adam and
AdamW, AdaScale otherwise). Several models in one job (a GAN) each take their own
``name``; the first one wrapped drives the batch size (:mod:`pollux.torch.model_followers`).
"""

from __future__ import annotations

from typing import Any

import torch

from pollux.adaptdl.default_job import DEFAULT_JOB
from pollux.adaptdl.torch.scaling_rules import ScalingRuleBase, native_rule
from pollux.torch.data_parallel import AdaptiveDataParallel as NativeDataParallel

DEFAULT_NAME = "adaptdl-dataparallel"


class GradientNoiseScale:
    """AdaptDL's ``model.gns``: the model's gradient statistics, read at the last
    agreement point (the agent measures them; nothing here changes them)."""

    def __init__(self, model: NativeDataParallel) -> None:
        self._model = model

    def sqr_avg(self) -> float:
        """``|G|^2``, the squared norm of the true gradient (0.0 before an estimate)."""
        stats = self._model.grad_stats
        return 0.0 if stats is None else float(stats.sqr)

    def var_avg(self) -> float:
        """``tr(Sigma) / M0``: the gradient variance at the initial batch size."""
        stats = self._model.grad_stats
        return 0.0 if stats is None else float(stats.var)

    @property
    def raw_sqr_avg(self) -> float:
        return self.sqr_avg()

    @property
    def raw_var_avg(self) -> float:
        return self.var_avg()

    def noise_scale(self) -> float | None:
        """The gradient noise scale in samples (None before an estimate)."""
        return self._model.noise_scale()

    def gain(self, scale: float) -> float:
        """Steps at the initial batch size one step at ``scale`` times it is worth."""
        stats = self._model.grad_stats
        if stats is None or stats.var + stats.sqr <= 0:
            return float(scale) if stats is not None else 1.0
        return float((stats.var + stats.sqr) / max(stats.var / scale + stats.sqr, 1e-30))

    def get_progress(self) -> float:
        """Statistical progress: the sum of the gains of every step so far."""
        return self._model.progress

    @property
    def accum_scale(self) -> float:
        """The last step's total batch over the initial one."""
        step = self._model._step
        if step.step_batch is None or not step.init_batch_size:
            return 1.0
        return step.step_batch / step.init_batch_size

    @property
    def accum_count(self) -> int:
        """Micro-batches of the last optimizer step, less one."""
        return self._model._step.num_micro - 1


class AdaptiveDataParallel(NativeDataParallel):
    """AdaptDL's ``AdaptiveDataParallel`` (see the module)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 lr_scheduler: Any = None, mp_scaler: Any = None, scaling_rule: Any = None,
                 name: str = DEFAULT_NAME, **kwargs: Any) -> None:
        if isinstance(mp_scaler, str):  # AdaptDL's examples pass the name 4th (older API)
            name, mp_scaler = mp_scaler, None
        job = DEFAULT_JOB.require("AdaptiveDataParallel")
        native_name = None if name == DEFAULT_NAME else name
        if native_name is None and job.models:
            raise ValueError("invalid name='adaptdl-dataparallel': a job with several "
                             "models needs name= on each (e.g. name='netD', name='netG')")
        rule = native_rule(scaling_rule, optimizer)
        super().__init__(model, optimizer, lr_scheduler, rule, job=job,
                         grad_scaler=mp_scaler, name=native_name, **kwargs)
        self.gns = GradientNoiseScale(self)
        """AdaptDL's gradient-noise view (``sqr_avg()``, ``var_avg()``, ``gain(scale)``)."""
        self.scaling_rule_base = scaling_rule if isinstance(scaling_rule, ScalingRuleBase) \
            else None
        if self.scaling_rule_base is not None:
            self.scaling_rule_base.initialize(self, optimizer)

    def to_tensorboard(self, writer: Any, global_step: int, tag_prefix: str = "") -> None:
        """Add AdaptDL's model scalars (``Gradient_Norm_Sqr``, ``Gradient_Variance``,
        ``Gain``, ``Learning_Rate_Factor``, ``Accum_Scale``, ``Progress``) under
        ``tag_prefix`` to a ``SummaryWriter``."""
        if tag_prefix and not tag_prefix.endswith("/"):
            tag_prefix += "/"
        gns = self.gns
        writer.add_scalar(tag_prefix + "Gradient_Norm_Sqr", gns.sqr_avg(), global_step)
        writer.add_scalar(tag_prefix + "Gradient_Variance", gns.var_avg(), global_step)
        writer.add_scalar(tag_prefix + "Gain", self.gain, global_step)
        writer.add_scalar(tag_prefix + "Learning_Rate_Factor", self.lr_factor, global_step)
        writer.add_scalar(tag_prefix + "Accum_Scale", gns.accum_scale, global_step)
        if gns.accum_count > 0:
            writer.add_scalar(tag_prefix + "Accum_Count", gns.accum_count, global_step)
        writer.add_scalar(tag_prefix + "Progress", self.progress, global_step)
