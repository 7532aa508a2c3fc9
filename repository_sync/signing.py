"""Sign and verify model version folders with OpenSSF model-signing (``model_signing`` 1.1.1).

What is signed: the whole version folder ``<N>/`` -- the model file AND ``config.pbtxt.intended``,
the config the version will serve with -- as a model_signing "files" manifest (SHA-256 per file,
symlinks refused, nothing ignored but the signature file itself, git files included). The bundle
(a Sigstore bundle v0.3 with a DSSE envelope, signed by an ECDSA key, no transparency log) is
written to ``<N>/<model file>.sig`` (see :mod:`repository_sync.layout`).

Verification (before every load) re-hashes the folder and compares it with the signed manifest, so
a changed byte, an added file or a removed file is refused and named. Several public keys may be
trusted at once (key rotation): the bundle carries a key hint (SHA-256 of the signer's PEM public
key, model_signing's own ``PublicKeyIdentifier.hint``), which is also the ``key_id`` recorded in
MLflow, and the matching trusted key is used.

Keys: ECDSA P-256 (``cryptography``), PEM. The private key comes from a file path (setting
``TRITONFLOW_SIGNING_KEY_PATH``) or from PEM bytes (e.g. an Airflow connection), which are written
to a private 0600 temporary file for the duration of the signing and deleted. Key material and key
paths' contents are never logged or put into messages.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ground.checksums import sha256_file
from ground.exceptions import DataError, SignatureVerificationError
from repository_sync.layout import INTENDED_CONFIG_FILENAME, SIGNATURE_SUFFIX

_DEFAULT_MODEL_FILENAME = re.compile(r'^\s*default_model_filename\s*:\s*"([^"]+)"', re.MULTILINE)


class SigningKeyError(DataError):
    """A signing or verification key is missing, unreadable or not an ECDSA P-256/384/521 key."""


@dataclasses.dataclass(frozen=True)
class SignatureInfo:
    """What a signature covers and who signed it (recorded on the MLflow model version).

    Attributes:
        signature_file: File name of the bundle inside the version folder.
        signature_digest: SHA-256 hex of the bundle bytes.
        key_id: SHA-256 hex of the signer's PEM SubjectPublicKeyInfo (model_signing's key hint).
        files: Signed file names, sorted.
    """

    signature_file: str
    signature_digest: str
    key_id: str
    files: tuple[str, ...]

    def to_dict(self) -> dict:
        """JSON-serialisable form."""
        return dataclasses.asdict(self) | {"files": list(self.files)}


# --------------------------------------------------------------------------- keys
def key_id_of(public_key_pem: bytes) -> str:
    """Key id of a PEM public key: SHA-256 hex of its PEM SubjectPublicKeyInfo encoding.

    This is the same value model_signing writes as the bundle's public-key hint.

    Raises:
        SigningKeyError: Not a PEM public key.
    """
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_public_key(public_key_pem)
    except ValueError as exc:
        raise SigningKeyError(f"not a PEM public key ({type(exc).__name__})") from None
    pem = key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(pem).hexdigest()


def generate_key_pair(
    private_key_path: str | os.PathLike[str],
    public_key_path: str | os.PathLike[str],
    *,
    overwrite: bool = False,
) -> str:
    """Create an ECDSA P-256 key pair as PEM files (private key mode 0600, unencrypted PKCS#8).

    Args:
        private_key_path: Where to write the private key.
        public_key_path: Where to write the public key (SubjectPublicKeyInfo).
        overwrite: Replace existing files; by default an existing file is refused.

    Returns:
        The key id (see :func:`key_id_of`).

    Raises:
        SigningKeyError: A target file exists and ``overwrite`` is false.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    private_key_path, public_key_path = Path(private_key_path), Path(public_key_path)
    for p in (private_key_path, public_key_path):
        if p.exists() and not overwrite:
            raise SigningKeyError(f"key file {str(p)!r} exists; pass overwrite=True to replace it")
    key = ec.generate_private_key(ec.SECP256R1())
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    private_key_path.parent.mkdir(parents=True, exist_ok=True)
    public_key_path.parent.mkdir(parents=True, exist_ok=True)
    # The public key first, the private key last and atomically (written aside, then renamed): a
    # reader that finds the private key (a concurrent publish checking for it) finds the pair.
    public_key_path.write_bytes(public_pem)
    staged = private_key_path.with_name(f".{private_key_path.name}.{os.getpid()}.tmp")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(private_pem)
    os.chmod(staged, 0o600)
    os.replace(staged, private_key_path)
    return hashlib.sha256(public_pem).hexdigest()


def load_public_keys(sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> dict[str, Path]:
    """Trusted public keys by key id.

    Args:
        sources: A folder (every ``*.pub`` / ``*.pem`` file in it that holds a public key), one
            file, or a sequence of files and folders.

    Returns:
        ``{key_id: path}``.

    Raises:
        SigningKeyError: No public key found, or a named file is not a PEM public key.
    """
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    keys: dict[str, Path] = {}
    for src in sources:
        src = Path(src)
        if src.is_dir():
            for p in sorted(src.iterdir()):
                if p.suffix in {".pub", ".pem"} and p.is_file():
                    with contextlib.suppress(SigningKeyError):
                        keys[key_id_of(p.read_bytes())] = p
        elif src.is_file():
            try:
                keys[key_id_of(src.read_bytes())] = src
            except SigningKeyError:
                raise SigningKeyError(f"trusted key file {str(src)!r} is not a PEM public key") from None
        else:
            raise SigningKeyError(f"trusted key source {str(src)!r} does not exist")
    if not keys:
        raise SigningKeyError(
            f"no trusted public key found in {[str(s) for s in sources]!r}: expected PEM files "
            "named *.pub or *.pem (TRITONFLOW_SIGNING_TRUSTED_KEYS_DIR)"
        )
    return keys


@contextlib.contextmanager
def _private_key_file(private_key: str | os.PathLike[str] | bytes) -> Iterator[Path]:
    if isinstance(private_key, bytes):
        with tempfile.TemporaryDirectory(prefix="tritonflow-key-") as tmp:
            os.chmod(tmp, 0o700)
            path = Path(tmp) / "signing.pem"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(private_key)
            yield path
        return
    path = Path(private_key)
    if not path.is_file():
        raise SigningKeyError(
            f"signing key file {str(path)!r} does not exist (TRITONFLOW_SIGNING_KEY_PATH); create "
            "one with repository_sync.signing.generate_key_pair"
        )
    yield path


def _hashing_config(signature_file: str):
    from model_signing import hashing

    return (
        hashing.Config()
        .use_file_serialization(hashing_algorithm="sha256", allow_symlinks=False)
        .set_ignored_paths(paths=[signature_file], ignore_git_paths=False)
    )


def _bundle_key_hint(bundle_text: str) -> str:
    try:
        data = json.loads(bundle_text)
        return data["verificationMaterial"]["publicKey"]["hint"]
    except (ValueError, KeyError, TypeError):
        return ""


def _signed_files(bundle_text: str) -> tuple[str, ...]:
    """File names listed in the bundle's in-toto statement."""
    return tuple(sorted(_signed_digests(bundle_text)))


def required_files(signature_file: str, intended_config_text: str | None) -> tuple[str, ...]:
    """Files a version folder's signature must cover: the model file and the intended config.

    The model file is the signature file's name less ``.sig`` (``model.onnx.sig`` -> ``model.onnx``,
    see :mod:`repository_sync.layout`) and, when the intended config sets
    ``default_model_filename``, that file too (the file Triton will actually load).

    Args:
        signature_file: Bundle file name, ``<model file>.sig``.
        intended_config_text: Text of ``config.pbtxt.intended``, or None when it is absent.

    Returns:
        Sorted file names (relative to the version folder).
    """
    names = {INTENDED_CONFIG_FILENAME}
    if signature_file.endswith(SIGNATURE_SUFFIX) and len(signature_file) > len(SIGNATURE_SUFFIX):
        names.add(signature_file[: -len(SIGNATURE_SUFFIX)])
    if intended_config_text:
        match = _DEFAULT_MODEL_FILENAME.search(intended_config_text)
        if match:
            names.add(match.group(1))
    return tuple(sorted(names))


def _missing_required(present: set[str], signature_file: str, intended_config_text: str | None) -> list[str]:
    """Required files absent from ``present`` (a model file may be a folder: ``name/...`` counts)."""
    return [
        name
        for name in required_files(signature_file, intended_config_text)
        if name not in present and not any(p.startswith(name + "/") for p in present)
    ]


def _read_intended(version_dir: Path) -> str | None:
    path = version_dir / INTENDED_CONFIG_FILENAME
    return path.read_text(errors="replace") if path.is_file() else None


def _refuse_unless_covered(files: set[str], version_dir: Path, signature_file: str,
                           refusal: Callable[[str, list[str]], Exception]) -> None:
    """Raise ``refusal(missing, sorted(files))`` unless ``files`` hold every required file.

    The required files are :func:`required_files` of ``version_dir`` (its intended config read
    from the folder); ``missing`` names the absent ones, comma-separated. Signing checks the
    folder's files, verifying the signed manifest.
    """
    missing = _missing_required(files, signature_file, _read_intended(version_dir))
    if missing:
        raise refusal(", ".join(missing), sorted(files))


# --------------------------------------------------------------------------- sign / verify
def sign_version(
    version_dir: str | os.PathLike[str],
    private_key: str | os.PathLike[str] | bytes,
    *,
    signature_file: str,
    password: str | None = None,
) -> SignatureInfo:
    """Sign every file of a version folder into ``version_dir / signature_file``.

    Args:
        version_dir: The folder to sign (model file + intended config; no sub-folders needed).
        private_key: Path of a PEM ECDSA private key, or the PEM bytes themselves.
        signature_file: Bundle file name inside ``version_dir`` (excluded from the manifest).
        password: Password of an encrypted private key.

    Returns:
        :class:`SignatureInfo` with digest and key id.

    Raises:
        SigningKeyError: Key missing or unusable (the message never contains key material).
        DataError: ``version_dir`` is not a folder, contains a symlink, or lacks the model file or
            the intended config (:func:`required_files`; an empty folder or one holding only a
            stray file is never signed).
    """
    from model_signing import signing

    version_dir = Path(version_dir)
    if not version_dir.is_dir():
        raise DataError(f"version folder {str(version_dir)!r} to sign does not exist")
    present = {
        p.relative_to(version_dir).as_posix()
        for p in version_dir.rglob("*")
        if p.is_file() and p.name != signature_file
    }
    _refuse_unless_covered(present, version_dir, signature_file, lambda missing, held: DataError(
        f"version folder {str(version_dir)!r} cannot be signed: missing {missing} "
        f"(it holds {held or 'no files'}); a signature must cover the model file "
        f"and {INTENDED_CONFIG_FILENAME}"
    ))
    sig_path = version_dir / signature_file
    sig_path.unlink(missing_ok=True)
    with _private_key_file(private_key) as key_path:
        try:
            config = signing.Config().set_hashing_config(_hashing_config(signature_file))
            config.use_elliptic_key_signer(private_key=key_path, password=password)
        except (ValueError, TypeError) as exc:
            # the message of cryptography's errors does not contain key bytes
            raise SigningKeyError(f"signing key is not a usable ECDSA PEM key: {exc}") from None
        try:
            config.sign(version_dir, sig_path)
        except ValueError as exc:
            raise DataError(f"cannot sign {str(version_dir)!r}: {exc}") from None
    text = sig_path.read_text()
    return SignatureInfo(
        signature_file=signature_file,
        signature_digest=sha256_file(sig_path),
        key_id=_bundle_key_hint(text),
        files=_signed_files(text),
    )


def _signed_digests(bundle_text: str) -> dict[str, str]:
    """``{file name: sha256 hex}`` from the bundle's in-toto statement (trust only once verified)."""
    try:
        payload = json.loads(base64.b64decode(json.loads(bundle_text)["dsseEnvelope"]["payload"]))
        return {r["name"]: r["digest"] for r in payload["predicate"]["resources"]}
    except (ValueError, KeyError, TypeError):
        return {}


def _describe_mismatch(bundle_text: str, version_dir: Path, signature_file: str, fallback: str) -> str:
    """Name the modified, extra and missing files of a folder against its verified manifest."""
    expected = _signed_digests(bundle_text)
    if not expected:
        return f"signature check failed for {str(version_dir)!r}: {fallback}"
    actual = {
        p.relative_to(version_dir).as_posix(): p
        for p in version_dir.rglob("*")
        if (p.is_file() or p.is_symlink()) and p.name != signature_file
    }
    parts = []
    modified = sorted(n for n in expected if n in actual and sha256_file(actual[n]) != expected[n])
    extra = sorted(set(actual) - set(expected))
    missing = sorted(set(expected) - set(actual))
    if modified:
        parts.append("modified file(s): " + ", ".join(modified))
    if extra:
        parts.append("unsigned extra file(s): " + ", ".join(extra))
    if missing:
        parts.append("signed file(s) missing: " + ", ".join(missing))
    detail = "; ".join(parts) or fallback
    return f"signature check failed for {str(version_dir)!r}: {detail}"


def verify_version(
    version_dir: str | os.PathLike[str],
    public_keys: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | dict[str, Path],
    *,
    signature_file: str,
) -> SignatureInfo:
    """Verify a version folder against its signature with one of the trusted keys.

    Args:
        version_dir: The version folder as it will be loaded (a local copy for S3).
        public_keys: Trusted keys: a folder, file(s), or the mapping from :func:`load_public_keys`.
        signature_file: Bundle file name inside ``version_dir``.

    Returns:
        :class:`SignatureInfo` (digest of the bundle, key id of the key that verified it).

    Raises:
        SignatureVerificationError: Signature file missing or unreadable, signed by an untrusted
            key, cryptographically invalid, the folder differs from the signed manifest (the
            message names each modified, extra or missing file), or the manifest is empty or lacks
            the model file or the intended config (:func:`required_files`).
        SigningKeyError: No usable trusted key.
    """
    from model_signing import verifying

    version_dir = Path(version_dir)
    keys = public_keys if isinstance(public_keys, dict) else load_public_keys(public_keys)
    sig_path = version_dir / signature_file
    if not sig_path.is_file():
        raise SignatureVerificationError(
            f"signature file {str(sig_path)!r} is missing: version folder {str(version_dir)!r} is "
            "unsigned and will not be loaded"
        )
    text = sig_path.read_text(errors="replace")
    hint = _bundle_key_hint(text)
    if hint and hint not in keys:
        raise SignatureVerificationError(
            f"signature file {str(sig_path)!r} was made with key id {hint}, which is not among the "
            f"trusted keys {sorted(keys)}"
        )
    candidates = [keys[hint]] if hint else list(keys.values())
    last_error = ""
    for key_path in candidates:
        config = verifying.Config().use_elliptic_key_verifier(public_key=key_path)
        config.set_hashing_config(_hashing_config(signature_file))
        try:
            config.verify(version_dir, sig_path)
        except ValueError as exc:
            message = str(exc)
            if message.startswith("Signature mismatch"):
                raise SignatureVerificationError(
                    _describe_mismatch(text, version_dir, signature_file, message)
                ) from None
            last_error = message.splitlines()[0] if message else type(exc).__name__
            continue
        except Exception as exc:  # malformed bundle (pydantic/protobuf), bad signature bytes
            last_error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            continue
        # the bundle is authentic and the folder matches it; now the manifest must be complete
        signed = set(_signed_digests(text))
        _refuse_unless_covered(signed, version_dir, signature_file, lambda missing, held: SignatureVerificationError(
            f"signature file {str(sig_path)!r} does not cover {missing} (signed "
            f"files: {held or 'none'}): a manifest without the model file and "
            f"{INTENDED_CONFIG_FILENAME} is refused and the folder will not be loaded"
        ))
        return SignatureInfo(
            signature_file=signature_file,
            signature_digest=sha256_file(sig_path),
            key_id=key_id_of(Path(key_path).read_bytes()),
            files=_signed_files(text),
        )
    raise SignatureVerificationError(
        f"signature file {str(sig_path)!r} does not verify with the trusted key(s): {last_error}"
    )
