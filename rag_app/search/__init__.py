"""Search: the index into ranked, cited notes (fusion, relevance, filters, time phrases, links, example questions)."""
