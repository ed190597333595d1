"""``gpucc holder serve``'s configuration: the merged options -> the service's HolderConfig.

:func:`apply_config` reads a configuration file (``--config``, YAML) into the options the
command line left at their defaults (old option spellings read as the new ones);
:func:`holder_config` builds the service's :class:`~gpucc.holder.service.HolderConfig` from the
merged options, at start and on SIGHUP: the datasets and their keys, the signing key, the
platform verifier (:func:`platform_verifier`) and the per-dataset release policies
(``releases``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from gpucc.core.errors import UsageError

from .output import note, warn

if TYPE_CHECKING:
    from gpucc.assembly import PlatformVerifier
    from gpucc.holder.service import HolderConfig, ReleasePolicy
    from gpucc.holder.state import PostgresState, SqliteState

    HolderState = SqliteState | PostgresState

__all__ = ["apply_config", "holder_config", "platform_verifier"]


#: keys of a configuration file that are not options
_FILE_ONLY = {"releases"}
#: options that have no key (the file itself; a secret that belongs in a 0600 file)
_NO_KEY = {"config", "service-key", "format"}


def apply_config(ctx: typer.Context, path: Path, given: dict[str, Any]) -> dict[str, Any]:
    """``given`` with each option left at its default taken from the configuration file
    (relative paths there are relative to the file); ``releases`` added."""
    from gpucc.core.errors import MalformedInputError
    from gpucc.core.files import read_capped
    from gpucc.core.jsonio import load_yaml_untrusted

    doc = load_yaml_untrusted(
        read_capped(path, 1024 * 1024, what="holder configuration"),
        what=f"holder configuration {path}",
        error=MalformedInputError,
    )
    if not isinstance(doc, dict):
        raise MalformedInputError(f"holder configuration {path} is not a mapping")
    options = {
        o.opts[0].removeprefix("--"): o
        for o in ctx.command.params
        if o.param_type_name == "option" and o.opts[0].startswith("--")
    }
    doc = _renamed_keys(doc)
    unknown = [k for k in doc if k not in _FILE_ONLY and (k not in options or k in _NO_KEY)]
    if unknown:
        raise MalformedInputError(f"holder configuration {path}: unknown key {unknown[0]!r}")
    merged = dict(given)
    merged["releases"] = None
    for name, value in _renamed_keys(doc).items():
        if name in _FILE_ONLY:
            merged[name] = value
            continue
        option = options.get(name)
        if option is None or name in _NO_KEY:
            raise MalformedInputError(f"holder configuration {path}: unknown key {name!r}")
        _check_type(option, value, f"holder configuration {path}: {name}")
        source = ctx.get_parameter_source(option.name or "")
        if source is not None and source.name != "DEFAULT":
            continue  # the command line's value wins
        if type(option.type).__name__.endswith("Path"):
            values = value if isinstance(value, list) else [value]
            values = [str(path.parent / v) if isinstance(v, str) else v for v in values]
            value = values if isinstance(value, list) else values[0]
        try:
            cast = option.type_cast_value(ctx, value)
        except typer.BadParameter as exc:
            raise MalformedInputError(
                f"holder configuration {path}: {name}: {exc.format_message()}"
            ) from None
        if type(option.type).__name__.endswith("Path") and isinstance(cast, str):
            cast = Path(cast)  # what Typer makes of the option's value
        merged[option.name or name] = cast
    return merged


#: the longest path a configuration may name, and the longest name in it (bytes, as Linux)
_MAX_PATH, _MAX_NAME = 4096, 255


def _check_type(option: Any, value: Any, where: str) -> None:
    """Refuse a configuration value whose type is not the option's, before click casts it
    (click's types take what a command line gives, text, and fail untyped on a list, a
    boolean or a huge number): a flag takes true or false, a number a number, a path or text
    a string without NUL; an option given more than once on the command line takes a list.

    Raises:
        MalformedInputError: ``where`` (the file and key) and what the key takes.
    """
    from gpucc.core.errors import MalformedInputError

    kind = "flag" if getattr(option, "is_flag", False) else _kind(option.type)
    wanted = _WANTED[kind]
    if getattr(option, "multiple", False):
        if not isinstance(value, list) or not all(_fits(kind, v) for v in value):
            raise MalformedInputError(f"{where}: takes a list, each item {wanted}")
    elif value is None:
        raise MalformedInputError(f"{where}: has no value (leave the key out for the default)")
    elif not _fits(kind, value):
        shown = "" if isinstance(value, str) else f", not {_shown(value)}"
        raise MalformedInputError(f"{where}: takes {wanted}{shown}")


_WANTED = {
    "flag": "true or false",
    "int": "an integer",
    "float": "a number",
    "path": "a path (text without NUL, each name at most 255 bytes)",
    "text": "text (without NUL)",
}


def _kind(kind: Any) -> str:
    """An option type's kind, by its class names (Typer's click types are its own copies)."""
    names = {c.__name__ for c in type(kind).__mro__}
    for name, found in (("BoolParamType", "flag"), ("IntParamType", "int")):
        if name in names:
            return found
    if "FloatParamType" in names:
        return "float"
    return "path" if type(kind).__name__.endswith("Path") else "text"


def _fits(kind: str, value: Any) -> bool:
    if kind == "flag":
        return isinstance(value, bool)
    if isinstance(value, bool):  # True == 1 in Python: a boolean is no number
        return False
    if kind == "int":
        return isinstance(value, int)
    if kind == "float":
        return isinstance(value, int | float)
    if not isinstance(value, str):
        return False
    return _fits_path(value) if kind == "path" else "\0" not in value and len(value) <= _MAX_PATH


def _fits_path(text: str) -> bool:
    """A path the system can name: no NUL, not empty, within Linux's length limits."""
    data = text.encode()
    return (
        bool(text)
        and b"\0" not in data
        and len(data) <= _MAX_PATH
        and all(len(part) <= _MAX_NAME for part in data.split(b"/"))
    )


def _shown(value: Any) -> str:
    """A configuration value for a message: its YAML type, and short text of its value."""
    names = {bool: "a boolean", int: "an integer", float: "a number", list: "a list"}
    names |= {dict: "a mapping", str: "text"}
    return names.get(type(value), type(value).__name__)


def _renamed_keys(doc: dict[str, Any]) -> dict[str, Any]:
    """A configuration's keys with the old option spellings (``cli.aliases``) read as the
    new ones, one note for each; a file that names both spellings keeps the new one."""
    from .aliases import RENAMED

    renamed: dict[str, Any] = {}
    for key, value in doc.items():
        new = RENAMED["holder serve"].get(f"--{key}")
        if new is None:
            renamed[key] = value
            continue
        warn(f"holder configuration: {key} is deprecated; use {new.removeprefix('--')}")
        renamed.setdefault(new.removeprefix("--"), value)
    return renamed


def _releases(p: dict[str, Any]) -> tuple[ReleasePolicy, ...]:
    """The configuration's per-dataset release policies (one verifier each, built once):
    ``name``, ``datasets``, and ``policy`` (an attestation policy file; default --policy)
    and/or ``requesters`` (public key files or ``sha256:`` key ids, one of which must have
    signed the offer)."""
    from gpucc.core.errors import MalformedInputError
    from gpucc.holder.service import ReleasePolicy

    doc = p.get("releases")
    if doc is None:
        return ()
    where = f"holder configuration {p['config_file']}: " if p.get("config_file") else ""
    if not isinstance(doc, list):
        raise MalformedInputError(
            f"{where}releases: a list of {{name, datasets, policy, requesters}}"
        )
    found = []
    base = Path(p["config_file"]).parent if p.get("config_file") else Path()
    for i, entry in enumerate(doc):
        if (
            not isinstance(entry, dict)
            or not {"name", "datasets"}
            <= set(entry)
            <= {"name", "datasets", "policy", "requesters"}
            or not isinstance(entry["name"], str)
            or not isinstance(entry.get("policy", ""), str)
            or not isinstance(entry["datasets"], list)
            or not all(isinstance(d, str) for d in entry["datasets"])
            or not isinstance(entry.get("requesters", []), list)
            or not all(isinstance(r, str) for r in entry.get("requesters", []))
            or not all(_fits("text", t) for t in [entry["name"], *entry["datasets"]])
            or not all(_fits("path", r) for r in entry.get("requesters", []))
            or ("policy" in entry and not _fits("path", entry["policy"]))
        ):
            raise MalformedInputError(
                f"{where}releases[{i}]: name (text), datasets (names), policy (a policy file), "
                "requesters (public key files or sha256: key ids), none with a NUL"
            )
        verifier = platform_verifier(p, base / entry["policy"]) if "policy" in entry else None
        requesters = frozenset(_requester(base, r, i) for r in entry.get("requesters", []))
        found.append(ReleasePolicy(entry["name"], tuple(entry["datasets"]), verifier, requesters))
    return tuple(found)


def _requester(base: Path, text: str, i: int) -> str:
    """A requester's key id from a public key file (relative to the configuration) or a
    ``sha256:<hex>`` key id."""
    from gpucc.core.files import read_capped
    from gpucc.travel.signing import KeyPin, key_id, load_public_key

    if text.startswith("sha256:"):
        return KeyPin.parse(text, f"releases[{i}].requesters").key_id
    path = base / text
    return key_id(load_public_key(read_capped(path, 16 * 1024, what="requester key"), str(path)))


def holder_config(p: dict[str, Any], state: HolderState | None) -> HolderConfig:
    """The service's configuration from the merged options (at start, and on SIGHUP)."""
    from gpucc.core.files import read_capped
    from gpucc.holder.service import HolderConfig, load_named_datasets
    from gpucc.travel.signing import load_public_key, load_signing_key

    if p["simulate_roots"] is not None:
        from gpucc.assembly.sources import missing_simulation_files

        missing = missing_simulation_files(p["simulate_roots"])
        if missing:
            raise UsageError(f"--simulate {p['simulate_roots']} lacks {', '.join(missing)}")
    names, keys = load_named_datasets(p["datasets"], p["dataset_keys"])
    orchestrator = p["orchestrator_key"]
    return HolderConfig(
        datasets=keys,
        dataset_names=names,
        releases=_releases(p),
        signing_key=load_signing_key(p["key"]),
        verifier=platform_verifier(p, p["policy"]),
        challenge_ttl=p["challenge_ttl"],
        max_request_bytes=p["max_request_kib"] * 1024,
        rate_per_s=p["rate"],
        burst=p["burst"],
        body_timeout_s=p["body_timeout"],
        max_challenges_per_client=p["max_challenges"],
        receipt_dir=p["receipt_dir"],
        orchestrator_key=None
        if orchestrator is None
        else load_public_key(read_capped(orchestrator, 16 * 1024), str(orchestrator)),
        state=state,
    )


def platform_verifier(p: dict[str, Any], policy: Path | None) -> PlatformVerifier:
    """A platform verifier for ``policy`` (the simulation's default when trusting a
    simulation without one) with the service's roots, network settings and collateral; the
    clock at each offer."""
    import os

    from gpucc.assembly import PlatformVerifier, Settings, select_policy
    from gpucc.gpuattest.netconfig import NetworkSettings
    from gpucc.staging.format import read_secret_file

    simulate_roots = p["simulate_roots"]
    pol = select_policy(policy, simulation=simulate_roots is not None)
    service_key = os.environ.get("NV_ATTESTATION_SERVICE_KEY")
    if p["service_key_file"] is not None:
        raw = read_secret_file(p["service_key_file"], 4096, what="service key")
        service_key = raw.decode("ascii", "replace").strip()
    verifier = PlatformVerifier(
        Settings(
            policy=pol,
            network=NetworkSettings(
                bundle=p["collateral"],
                offline=p["offline"],
                rim_url=p["rim_url"],
                ocsp_url=p["ocsp_url"],
                service_key=service_key,
                cache_dir=p["cache_dir"],
            ),
            rim_dir=p["rim_dir"],
            simulation=simulate_roots,
            pccs_url=p["pccs_url"],
        )
    )
    if verifier.allow_gpu_only:
        note("policy relaxation cvm.allow_gpu_only: GPU-only (version 1) offers are accepted")
    return verifier
