"""Triton model control: load verified versions, keep a model's desired versions, drive replicas.

* :mod:`~repository_sync.triton.client`: :class:`TritonModelControl`, the client of one Triton in
  explicit mode (verified load, wait for READY, unload, index, smoke inference);
* :mod:`~repository_sync.triton.inputs`: input tensors from a sample, integer ids kept exact;
* :mod:`~repository_sync.triton.model_control`: the desired set of versions each model keeps
  loaded, serialised per model through the shared database (:func:`reconcile`);
* :mod:`~repository_sync.triton.replicas`: :class:`TritonReplicaSet`, several replicas of one
  repository controlled as one, and :func:`triton_control`, which picks one or the other.
"""
