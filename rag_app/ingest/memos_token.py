"""Which Memos server may be sent which token: a token belongs to one origin, never sent to another."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from rag_app.config import ConfigError, SourceSpec
from rag_app.index.manifest import Manifest

TOKEN_ORIGIN = "memos_token_origin"


def memos_token(spec: SourceSpec, manifest: Manifest) -> tuple[str | None, str | None]:
    """The token this Memos source may be sent, and a warning when a token exists that is not its own.

    A token belongs to one server. `token_env` in a source's config names its own variable. The generic
    CFLOW_API_TOKEN / MEMOS_TOKEN belongs to the origin of the first Memos source synced with it: that binding,
    never the token, is kept in the manifest, and no other origin is sent the token."""
    from readers.memos_client import TOKEN_ENV_VARS, token_from_env

    if spec.token_env:
        token = os.environ.get(spec.token_env, "").strip()
        if not token:
            raise ConfigError(f"source {spec.name}: its token_env names ${spec.token_env}, which is not set")
        return token, None
    generic = token_from_env()
    bound = manifest.get_meta(TOKEN_ORIGIN)
    if not generic or bound in (None, url_origin(spec.url)):
        return generic, None
    return None, (f"{TOKEN_ENV_VARS[0]} belongs to {bound}, so it is not sent to {url_origin(spec.url)}; give this "
                  'source its own token: token_env = "VARIABLE" in its [[sources]] entry of config.toml')


def url_origin(url: str) -> str:
    """scheme://host:port, the unit a token belongs to."""
    parts = urlsplit(url.strip())
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme.lower()}://{(parts.hostname or '').lower()}:{port}"
