"""Triton model repository storage: one small interface, a filesystem/NFS and an S3 backend.

Guarantees of :meth:`~repository_sync.storage.base.RepositoryStorage.push_version`:

* **Immutable versions.** A published ``<model>/<N>/`` is never overwritten. Pushing identical
  content again is a no-op (status ``"unchanged"``; the signature file is not compared because
  ECDSA signatures differ between two signings of the same bytes); different content is refused
  with :class:`RepositoryConflictError` naming the differing files.
* **Never half-visible.** Files are first written to a staging folder ``<model>/.staging-<N>-<token>/``
  inside the model folder, which Triton ignores (its version scan keeps only names ``std::stoll``
  can parse; a leading ``.`` cannot be parsed). The optional ``verify`` callback (the signature
  check) runs on the staged copy *at the destination*, and only then is the version made visible.
* **A failed push leaves the repository as it was**: the staging folder, any partly copied final
  objects and a model folder created by this push are removed before the error propagates. A
  process that dies mid-push leaves at most a staging folder (filesystem) or staging objects / a
  version prefix without its model file (S3): never loadable, and cleaned by the next push.

Filesystem/NFS: staging is on the same filesystem as the version (same model folder), files are
fsynced, then ``os.rename(staging, <N>)`` publishes the folder atomically (POSIX rename; on NFS the
server performs it as one operation). A concurrent publisher that wins the rename makes ours fail
with ``ENOTEMPTY``; we then compare contents as for a re-publish.

S3 has no atomic rename, so the design relies on what Triton tolerates: Triton (explicit mode)
reads a version only when asked to load it, and a version folder without its model file cannot
load. The objects are uploaded under a staging prefix, downloaded back and verified, then copied
server-side into ``<prefix>/<model>/<N>/`` with **the model file copied last** (the commit point),
the staging prefix is deleted, and finally the listing of ``<prefix>/<model>/<N>/`` is checked to
hold the model file, the intended config and the signature. tritonflow's loader additionally
verifies the signature before every load, so a version prefix that lacks any signed file is refused.

Serving config (``<model>/config.pbtxt``): Triton has one config per model, the champion's. A push
writes it only when the model has none yet (first version); otherwise it is left untouched. Every
version carries the config it was built for in ``<N>/config.pbtxt.intended`` (signed with the model
file) and :mod:`repository_sync.triton.client` loads a version by passing that config through the
repository load API's ``config`` parameter, which overrides the on-disk config for that load. So
publishing a challenger whose config differs never changes the champion's serving config; a
promotion that wants the new config to be the on-disk default calls
:meth:`RepositoryStorage.write_serving_config` explicitly.

S3 URLs follow Triton's syntax: ``s3://bucket/prefix`` for AWS and
``s3://http(s)://host:port/bucket/prefix`` for any other endpoint. See
:func:`repository_sync.storage.s3.parse_s3_repository_url`.

Layout: the interface and the helpers the backends share are in :mod:`repository_sync.storage.base`,
one module per backend beside it (:mod:`repository_sync.storage.filesystem`,
:mod:`repository_sync.storage.s3`), and :mod:`repository_sync.storage.open` chooses one for a URI
(:func:`~repository_sync.storage.open.open_repository`). A new backend (``gs://``) is a new module
here defining ``class X(RepositoryStorage, scheme="gs")``, imported in
:mod:`repository_sync.storage.open`.
"""
