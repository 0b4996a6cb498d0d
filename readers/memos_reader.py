"""LlamaIndex reader for Memos / CFlow servers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from readers.listing import MemosLister
from readers.listing_reader import ListingReader
from readers.memos_client import token_from_env


class MemosReader(ListingReader):
    """Reads the memos a token can see on a Memos (or CFlow) server as Documents, one per memo: all, or what changed.

    Speaks every API generation (v0.14 to current). Each Document has `id_ = "memos:<source>/<uid>"` (`<uid>` is the
    memo's uid, or its numeric id on servers before v0.22), the memo's markdown as text, and this metadata (lists are
    JSON strings): `kind` ("memos"), `source`, `title` (the property title, else the first `# heading`, else the
    first line), `memo_id`, `url` (the memo's page, for citations), `tags`, `links` (note ids of referenced memos),
    `visibility` (PUBLIC, PROTECTED or PRIVATE), `pinned`, `archived`, `creator`, `attachments` (file names),
    `parent` (the note id of the memo a comment belongs to, when it is one), `created`/`created_ts`,
    `updated`/`updated_ts`.

    Args:
        base_url: the server, e.g. "https://memos.example.com".
        token: an access token; None reads CFLOW_API_TOKEN (or MEMOS_TOKEN) from the environment, "" reads
            anonymously (PUBLIC memos only). Never logged: errors are redacted.
        include_archived: also read archived memos.
        include_comments: also read comments (each as its own Document with a `parent`).
        source: the name in note ids, which keeps two servers' memo 1 apart.
        known: what an index already holds, note id → the Document's `hash` ("" when the memo must be read again):
            a memo with that hash yields no Document (its id goes to `unchanged_ids`); known memos the server no
            longer lists are in `gone_ids`.
        signatures: for known memos, their `signatures` from an earlier pass (the reader's `signatures` property):
            a memo whose answer from the server still matches is not even parsed (what keeps a no-change sync of
            thousands of memos fast). Optional.
        **limits: `MemosClient` limits against hostile or broken servers (`max_memos`, `max_memo_bytes`,
            `max_response_bytes`, `max_listing_bytes`, `request_deadline`, `listing_deadline`, `timeout`,
            `max_retries`, `page_size`).

    The listing itself is `MemosLister` (no LlamaIndex import): `brain sync` lists with it, then takes the Documents
    of that same pass from `lister.reader().lazy_load_data(listing=...)` when something changed, so the server is
    read once.

    The whole listing is read before anything is yielded; one that cannot be read completely raises `MemosError`
    (`MemosAuthError` for token problems), never a partial list that would look like deletions. A memo over
    `max_memo_bytes` is skipped with a warning and listed in `kept_ids`.

    Example:
        >>> from readers.memos_reader import MemosReader
        >>> documents = MemosReader("https://memos.example.com", token="memos_pat_...").load_data()
        >>> reader = MemosReader("https://memos.example.com", known={d.id_: d.hash for d in documents})
        >>> changed = reader.load_data()
        >>> reader.gone_ids, reader.warnings
    """

    lister: MemosLister

    def __init__(self, base_url: str, token: str | None = None, include_archived: bool = False,
                 include_comments: bool = True, source: str = "memos", known: Mapping[str, str] | None = None,
                 signatures: Mapping[str, str] | None = None, **limits: Any):
        super().__init__(MemosLister(base_url, token if token is not None else token_from_env(),
                                     include_archived=include_archived, include_comments=include_comments,
                                     source=source, known=known, signatures=signatures, **limits))

    def __repr__(self) -> str:
        token = "set" if self.lister.has_token else "none"
        return f"MemosReader({self.lister.base_url!r}, token={token}, source={self.lister.source!r})"
