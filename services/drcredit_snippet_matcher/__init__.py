"""Snippet-matcher service: one judge call per search turn with unvisited snippets."""
