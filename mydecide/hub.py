"""Names on the Hugging Face hub: a model name checked before transformers spends a minute on it, and an adapter id
resolved through the local Hugging Face cache (``mydecide push`` uploads one; :mod:`mydecide.modeling` loads both)."""

from __future__ import annotations

import os
from pathlib import Path

HUB_PROBE_TIMEOUT_S = 4.0


class ModelNotFoundError(FileNotFoundError):
    """A model name that is no local path, no alias, not in the local Hugging Face cache and not on the hub."""


def hub_model(name: str, aliases: tuple[str, ...] = ()) -> str:
    """``name`` when the local Hugging Face cache holds it or the hub knows it; else :class:`ModelNotFoundError`
    saying what was tried. The hub is asked once with a short timeout, so a typo never spends a minute retrying an
    unreachable hub inside ``from_pretrained``."""
    import difflib

    from huggingface_hub import constants, model_info, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError, RepositoryNotFoundError, RevisionNotFoundError

    close = difflib.get_close_matches(name.lower(), aliases, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else ""
    tried = f"{name}: not a local model directory, not an alias ({', '.join(aliases)}{hint})"
    try:
        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return name
    except HFValidationError:
        raise ModelNotFoundError(f"{tried}, and not a valid hub model id") from None
    cache = f"not in the local Hugging Face cache ({constants.HF_HUB_CACHE})"
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    if offline or constants.HF_HUB_OFFLINE:
        raise ModelNotFoundError(f"{tried}, {cache}, and the hub is off (HF_HUB_OFFLINE is set)")
    try:
        model_info(name, timeout=HUB_PROBE_TIMEOUT_S)
    except (RepositoryNotFoundError, RevisionNotFoundError):
        raise ModelNotFoundError(f"{tried}, {cache}, and the hub has no model {name!r} (or it is private)") from None
    except Exception as err:  # the hub cannot be reached: no network, a proxy, a timeout, a server error
        reason = str(err).splitlines()[0][:120] if str(err) else type(err).__name__
        raise ModelNotFoundError(f"{tried}, {cache}, and the hub cannot be reached ({reason})") from None
    return name


def local_adapter(name: str | Path) -> Path:
    """An adapter's local directory: ``name`` itself when it exists (or is written as a path), else a hub id
    (``owner/name``) resolved through the Hugging Face cache (``snapshot_download``: offline with HF_HUB_OFFLINE
    set, from a cache ``mydecide push`` or ``hf download`` filled). A :class:`FileNotFoundError` in one line."""
    path = Path(name).expanduser()
    text = str(name)
    if path.exists() or text.startswith((".", "/", "~")) or text.count("/") != 1:
        return path
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError, RepositoryNotFoundError

    tried = f"{text}: no such adapter directory"
    try:
        return Path(snapshot_download(text))
    except HFValidationError:
        raise FileNotFoundError(f"{tried}, and not a valid hub id") from None
    except RepositoryNotFoundError:
        raise FileNotFoundError(f"{tried}, and the hub has no repository {text!r} (or it is private)") from None
    except LocalEntryNotFoundError:
        raise FileNotFoundError(
            f"{tried}, and not in the local Hugging Face cache ({constants.HF_HUB_CACHE}) with the hub unreachable "
            "or off (HF_HUB_OFFLINE)"
        ) from None
