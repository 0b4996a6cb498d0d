"""What shaped a search besides the question's words, said once for every shell: the gloss in the notes' language it
was also searched as (rag_app.search.cross_language) and the date filter a time phrase became, or why that phrase
filtered nothing (rag_app.search.retrieve). Plain sentences: each shell makes them safe for its own screen."""

from __future__ import annotations

from typing import Any


def search_notes(coverage: dict[str, Any]) -> list[str]:
    """The sentences for a search's `coverage`, in the order they shaped it."""
    notes = []
    gloss = coverage.get("translation")
    if gloss:
        notes.append(f"also searched in {coverage.get('translation_language') or 'English'}, word by word: \"{gloss}\"")
    time_note = time_filter_note(coverage)
    if time_note:
        notes.append(time_note)
    return notes


def time_filter_note(coverage: dict[str, Any]) -> str | None:
    """The date range a time phrase in the question became ("上个月的读书笔记"), which filters what is found; or why
    a time phrase filtered nothing (no note is dated in its range: it was searched as words)."""
    phrase, ignored = coverage.get("time_phrase"), coverage.get("time_phrase_ignored")
    if ignored:
        return f"\"{ignored}\" filtered nothing: no note is dated in that range, so it was searched as words"
    if not phrase:
        return None
    return f"time filter from \"{phrase['phrase']}\": {phrase['since']} – {phrase['until']}"
