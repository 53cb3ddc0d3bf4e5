"""AdaptDL's API over the Pollux agent: move an AdaptDL script by changing its imports.

============================  =========================================
AdaptDL                       Pollux
============================  =========================================
``import adaptdl``            ``from pollux import adaptdl``
``import adaptdl.torch``      ``import pollux.adaptdl.torch``
``import adaptdl.torch as adl``  ``import pollux.adaptdl.torch as adl``
``from adaptdl.torch import X``  ``from pollux.adaptdl.torch import X``
============================  =========================================

Everything else stays: ``adaptdl.torch.init_process_group("gloo")``,
``AdaptiveDataLoader``, ``AdaptiveDataParallel(model, optimizer, scheduler)``,
``remaining_epochs_until``, ``Accumulator()``, ``adaptdl.env``, ``adaptdl.collective``,
``adaptdl.checkpoint``. The job is the process-wide default one
(:mod:`pollux.adaptdl.default_job`), as in AdaptDL; the native API,
:mod:`pollux.torch`, passes it explicitly. The docs' page train/integrations.md maps
the imports.
"""

from __future__ import annotations

from pollux.adaptdl import checkpoint, collective, env

__all__ = ["checkpoint", "collective", "env"]
