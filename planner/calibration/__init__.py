"""Calibration and validation on the user's own machine: ``fxplan calibrate`` and ``fxplan validate``.

* :mod:`~fxplan.calibration.collectives_worker` — what each rank runs under torchrun: the
  collectives over a size sweep, the memory a process holds before its first tensor, the
  host↔device bandwidth;
* :mod:`~fxplan.calibration.collectives` — launching that worker, and the fit of a link level's
  bandwidth and hop latency to its measurements in the cost model's own form;
* :mod:`~fxplan.calibration.compute` — the compute efficiencies an op database implies;
* :mod:`~fxplan.calibration.spec_yaml` — a cluster spec as YAML with a comment on each
  measured value;
* :mod:`~fxplan.calibration.calibrate` — the whole calibration: measure, derive the spec,
  compare with the spec it started from;
* :mod:`~fxplan.calibration.validate` — a plan launched for a few steps, predicted against
  measured per rank.
"""
